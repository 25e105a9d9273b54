// dmem live page: hand-written, no dependencies. Data come from GET /v1/live and
// POST /v1/search with the bearer token in the Authorization header (never in a URL
// the server sees). Every value from the server is written with textContent or as an
// SVG attribute, never as HTML.
(function () {
  "use strict";

  var SVGNS = "http://www.w3.org/2000/svg";
  var POLL_MS = 3000;
  var TOKEN_KEY = "dmem.token";
  var COLORS = { core: "#d62728", buffer: "#ff7f0e", drop: "#9a9a9a" };
  var ROUTES = ["drop", "buffer", "core"];

  var params = new URLSearchParams(window.location.search);
  var state = { tenant: params.get("tenant") || null, autoQuery: params.get("q"), timer: null, refused: null,
                gen: 0 };

  // ------------------------------------------------------------------ token
  // /ui/#tenant=T opens on that tenant; #token=... is kept in this tab's storage and
  // removed from the address bar at once: on load, and when a link is pasted into an
  // open tab (hashchange). True when the fragment named a tenant or a token.
  function takeFragment() {
    var t = /(?:^#|&)tenant=([^&]*)/.exec(window.location.hash);
    var m = /(?:^#|&)token=([^&]*)/.exec(window.location.hash);
    if (t) { state.tenant = decodeURIComponent(t[1]); }
    if (m) {
      sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
      history.replaceState(null, "", window.location.pathname + window.location.search +
                           (t ? "#tenant=" + t[1] : ""));
    }
    return Boolean(t || m);
  }
  takeFragment();

  function token() { return sessionStorage.getItem(TOKEN_KEY); }

  function api(method, path, body) {
    var headers = { "Accept": "application/json" };
    var t = token();
    if (t) { headers["Authorization"] = "Bearer " + t; }
    var opts = { method: method, headers: headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    return fetch(path, opts).then(function (r) {
      return r.text().then(function (text) {
        var data = null;
        try { data = text ? JSON.parse(text) : null; } catch (e) { data = { error: text }; }
        return { status: r.status, body: data };
      });
    });
  }

  // ------------------------------------------------------------------ helpers
  function $(id) { return document.getElementById(id); }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) { Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); }); }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }

  function svg(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    if (attrs) { Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); }); }
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    return e;
  }

  function pad(n, w) { n = String(n); while (n.length < (w || 2)) { n = "0" + n; } return n; }

  // HH:MM:SS in this browser's time zone; tenths of a second when the axis is short.
  function fmtTime(ms, fine) {
    if (ms === null || ms === undefined) { return "\u2013"; }
    var d = new Date(ms);
    var s = pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
    if (fine) { s += "." + Math.floor(d.getMilliseconds() / 100); }
    return s;
  }

  // A moment a person reads in a table: HH:MM:SS today, else its date and minute (a
  // memory of a replayed chat from last year must not read as "later today").
  function fmtWhen(ms) {
    if (ms === null || ms === undefined) { return "\u2013"; }
    var d = new Date(ms), now = new Date();
    if (d.toDateString() === now.toDateString()) { return fmtTime(ms); }
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes());
  }

  function fmtNum(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) { return "\u2013"; }
    var d = digits === undefined ? 3 : digits;
    if (d > 0 && v !== 0 && Math.abs(v) < Math.pow(10, -d)) { return Number(v).toExponential(1); }
    return Number(v).toFixed(d);
  }

  function clear(node) { while (node.firstChild) { node.removeChild(node.firstChild); } return node; }

  function row(cells, attrs) {
    var tr = el("tr", attrs);
    cells.forEach(function (c) {
      var td = typeof c === "object" && c !== null && c.text !== undefined
        ? el("td", c.cls ? { "class": c.cls } : null, c.text) : el("td", null, c);
      tr.appendChild(td);
    });
    return tr;
  }

  function num(v, digits) { return { text: fmtNum(v, digits), cls: "num" }; }

  function setStatus(text, isError) {
    var s = $("status");
    s.textContent = text;
    s.className = isError ? "status error" : "status";
  }

  function niceTicks(lo, hi, n) {
    var span = hi - lo;
    if (!(span > 0)) { return [lo]; }
    var step = Math.pow(10, Math.floor(Math.log(span / n) / Math.LN10));
    [1, 2, 5, 10].some(function (m) { if (span / (step * m) <= n) { step *= m; return true; } return false; });
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) { out.push(v); }
    return out;
  }

  // ------------------------------------------------------------------ charts
  var W = 960, H = 230, M = { l: 48, r: 12, t: 10, b: 26 };

  function frame(height) {
    return svg("svg", { viewBox: "0 0 " + W + " " + height, width: W, height: height,
                        role: "img" });
  }

  function yAxis(g, ys, x0, x1, digits) {
    ys.forEach(function (v) {
      var y = v.y;
      g.appendChild(svg("line", { x1: x0, x2: x1, y1: y, y2: y, "class": "grid" }));
      g.appendChild(svg("text", { x: x0 - 4, y: y + 4, "text-anchor": "end" }, fmtNum(v.v, digits)));
    });
  }

  function timeAxis(g, t0, t1, sx, y) {
    var span = t1 - t0, fine = span < 10000;
    g.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: y, y2: y }));
    var n = 6;
    for (var i = 0; i <= n; i++) {
      var t = t0 + span * i / n, x = sx(t);
      g.appendChild(svg("line", { x1: x, x2: x, y1: y, y2: y + 4 }));
      g.appendChild(svg("text", { x: x, y: y + 16, "text-anchor": i === 0 ? "start" : i === n ? "end" : "middle",
                                  "class": "time-label" }, fmtTime(t, fine)));
    }
  }

  function gateChart(gate) {
    var box = clear($("gate-chart"));
    var series = gate.series || [];
    if (!series.length) { return; }
    var t0 = series[0].t0, t1 = series[series.length - 1].t1;
    if (t1 <= t0) { t1 = t0 + 1000; }
    var ymax = 0;
    series.forEach(function (b) {
      ymax = Math.max(ymax, b.q90, b.theta_high || 0, b.theta_low || 0);
    });
    ymax = ymax > 0 ? ymax * 1.15 : 1;
    var sx = function (t) { return M.l + (W - M.l - M.r) * (t - t0) / (t1 - t0); };
    var sy = function (v) { return H - M.b - (H - M.t - M.b) * Math.min(v, ymax) / ymax; };
    var root = frame(H), axes = svg("g", { "class": "axis" });
    root.appendChild(axes);
    yAxis(axes, niceTicks(0, ymax, 4).map(function (v) { return { v: v, y: sy(v) }; }),
          M.l, W - M.r, 2);
    var mid = function (b) { return sx((b.t0 + b.t1) / 2); };
    var upper = series.map(function (b) { return mid(b) + "," + sy(b.q90); });
    var lower = series.slice().reverse().map(function (b) { return mid(b) + "," + sy(b.q10); });
    root.appendChild(svg("polygon", { points: upper.concat(lower).join(" "), fill: "#c6dbef",
                                      "class": "band" }));
    root.appendChild(svg("polyline", { points: series.map(function (b) { return mid(b) + "," + sy(b.q50); }).join(" "),
                                       fill: "none", stroke: "#1f77b4", "stroke-width": 2, "class": "median" }));
    series.forEach(function (b) {
      var c = svg("circle", { cx: mid(b), cy: sy(b.max), r: 2.5, fill: "#1f77b4", "class": "max" });
      c.appendChild(svg("title", null, fmtTime(b.t0) + "\u2013" + fmtTime(b.t1) + ": " + b.n +
        " decisions, median " + fmtNum(b.q50) + ", max " + fmtNum(b.max)));
      root.appendChild(c);
    });
    [["theta_low", "#2ca02c"], ["theta_high", "#9467bd"]].forEach(function (p) {
      // a step line: each bin's threshold holds until the next bin with decisions
      var pts = [];
      series.forEach(function (b, i) {
        if (b[p[0]] === null || b[p[0]] === undefined) { return; }
        var end = i + 1 < series.length ? series[i + 1].t0 : b.t1;
        pts.push(sx(b.t0) + "," + sy(b[p[0]]), sx(end) + "," + sy(b[p[0]]));
      });
      if (pts.length) {
        root.appendChild(svg("polyline", { points: pts.join(" "), fill: "none", stroke: p[1],
                                           "stroke-width": 1.5, "stroke-dasharray": "5 3",
                                           "class": p[0] }));
      }
    });
    timeAxis(axes, t0, t1, sx, H - M.b);
    box.appendChild(root);
    routesChart(series, t0, t1, sx);
  }

  function routesChart(series, t0, t1, sx) {
    var box = clear($("routes-chart")), h = 110, top = 8, bottom = 26;
    var nmax = 1;
    series.forEach(function (b) { nmax = Math.max(nmax, b.n); });
    var sy = function (v) { return (h - bottom - top) * v / nmax; };
    var root = frame(h), axes = svg("g", { "class": "axis" });
    root.appendChild(axes);
    yAxis(axes, [0, nmax].map(function (v) { return { v: v, y: h - bottom - sy(v) }; }),
          M.l, W - M.r, 0);
    series.forEach(function (b) {
      var x = sx(b.t0), w = Math.max(sx(b.t1) - sx(b.t0) - 1, 1), y = h - bottom;
      ROUTES.forEach(function (r) {
        var n = b.routes[r] || 0;
        if (!n) { return; }
        var rect = svg("rect", { x: x, y: y - sy(n), width: w, height: sy(n), fill: COLORS[r],
                                 "class": "route-" + r });
        rect.appendChild(svg("title", null, fmtTime(b.t0) + ": " + n + " " + r));
        root.appendChild(rect);
        y -= sy(n);
      });
    });
    timeAxis(axes, t0, t1, sx, h - bottom);
    box.appendChild(root);
  }

  function histChart(gate) {
    var box = clear($("hist-chart")), hist = gate.histogram;
    if (!hist) { return; }
    var h = 200, edges = hist.edges, nb = edges.length - 1, top = edges[nb];
    var totals = [], cmax = 1;
    for (var i = 0; i < nb; i++) {
      var s = 0;
      ROUTES.forEach(function (r) { s += hist.counts[r][i]; });
      totals.push(s);
      cmax = Math.max(cmax, s);
    }
    var sx = function (v) { return M.l + (W - M.l - M.r) * Math.min(v, top) / top; };
    // log scale: a sparse-reward stream drops hundreds for every memory it keeps
    var sy = function (c) { return (h - M.t - M.b) * Math.log(1 + c) / Math.log(1 + cmax); };
    var root = frame(h), axes = svg("g", { "class": "axis" });
    root.appendChild(axes);
    var ticks = [0, 1, 10, 100, 1000, 10000, 100000].filter(function (v) { return v <= cmax; });
    yAxis(axes, ticks.map(function (v) { return { v: v, y: h - M.b - sy(v) }; }), M.l, W - M.r, 0);
    for (i = 0; i < nb; i++) {
      var y = h - M.b, x = sx(edges[i]), w = Math.max(sx(edges[i + 1]) - x - 1, 1);
      ROUTES.forEach(function (r) {
        var c = hist.counts[r][i];
        if (!c) { return; }
        var below = totalsBelow(i, r), hh = sy(below + c) - sy(below);
        var rect = svg("rect", { x: x, y: y - hh, width: w, height: hh, fill: COLORS[r],
                                 "class": "hist-" + r });
        rect.appendChild(svg("title", null, fmtNum(edges[i], 2) + "\u2013" + fmtNum(edges[i + 1], 2) +
          ": " + c + " " + r));
        root.appendChild(rect);
        y -= hh;
      });
    }
    function totalsBelow(i, route) {
      var s = 0;
      for (var j = 0; j < ROUTES.indexOf(route); j++) { s += hist.counts[ROUTES[j]][i]; }
      return s;
    }
    [["theta_low", "#2ca02c"], ["theta_high", "#9467bd"]].forEach(function (p) {
      var v = gate[p[0]];
      if (v === null || v === undefined) { return; }
      var x = sx(v);
      root.appendChild(svg("line", { x1: x, x2: x, y1: M.t, y2: h - M.b, stroke: p[1],
                                     "stroke-width": 2, "stroke-dasharray": "5 3", "class": p[0] }));
      root.appendChild(svg("text", { x: x + 3, y: M.t + 10, "class": "bar-label" },
                           (p[0] === "theta_low" ? "\u03b8 low " : "\u03b8 high ") + fmtNum(v, 2)));
    });
    axes.appendChild(svg("line", { x1: M.l, x2: W - M.r, y1: h - M.b, y2: h - M.b }));
    niceTicks(0, top, 8).forEach(function (v) {
      axes.appendChild(svg("text", { x: sx(v), y: h - M.b + 16, "text-anchor": "middle" }, fmtNum(v, 2)));
    });
    box.appendChild(root);
  }

  function legend(id, items) {
    var box = clear($(id));
    items.forEach(function (it) {
      var s = el("span");
      s.appendChild(el("span", { "class": "swatch " + it[0] }));
      s.appendChild(document.createTextNode(it[1]));
      box.appendChild(s);
    });
  }

  // ------------------------------------------------------------------ sections
  function renderTenants(data) {
    var body = clear(document.querySelector("#tenants tbody"));
    $("tenants-note").textContent = data.tenants.length ? (data.notes || []).join("; ")
      : "no tenants yet: nothing stored and no gate decision seen since this worker started";
    data.tenants.forEach(function (t) {
      var attrs = { "data-tenant": t.tenant };
      if (t.core !== undefined) {
        attrs["data-core"] = t.core; attrs["data-buffer"] = t.buffer; attrs["data-total"] = t.total;
      }
      if (t.tenant === data.tenant) { attrs["class"] = "selected"; }
      attrs["tabindex"] = "0";
      var tr = row([t.tenant, num(t.core, 0), num(t.buffer, 0), num(t.total, 0),
                    num(t.theta_low), num(t.theta_high), fmtWhen(t.last_event_ts)], attrs);
      tr.addEventListener("click", function () { select(t.tenant); });
      tr.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); select(t.tenant); }
      });
      body.appendChild(tr);
    });
  }

  function renderGate(data) {
    var gate = data.gate;
    ["gate-tenant", "decisions-tenant", "search-tenant"].forEach(function (id) {
      $(id).textContent = data.tenant || "";
    });
    if (!gate || !gate.decisions) {
      clear($("gate-chart")); clear($("routes-chart")); clear($("hist-chart")); clear($("gate-legend"));
      $("gate-note").textContent = data.tenant
        ? "no gate decisions of " + data.tenant + " since this worker's feed started" +
          (data.feed && !data.feed.enabled ? " (the feed is off: DMEM_RESPOND__LIVE_PER_TENANT=0)" : "")
        : "no tenant selected";
      return;
    }
    $("gate-note").textContent = "gate score = max(extrinsic, w \u00b7 intrinsic), the quantity the gate " +
      "compares with its thresholds; newest " + gate.decisions + " decisions (" + fmtTime(gate.first_ts) +
      "\u2013" + fmtTime(gate.last_ts) + "): core " + gate.routes.core + ", buffer " + gate.routes.buffer +
      ", drop " + gate.routes.drop + "; current \u03b8 low " + fmtNum(gate.theta_low) +
      ", \u03b8 high " + fmtNum(gate.theta_high) +
      (gate.histogram && gate.histogram.clipped ? "; " + gate.histogram.clipped + " scores beyond the axis in the last bin" : "");
    legend("gate-legend", [["sw-band", "q10\u2013q90 of the gate score"], ["sw-median", "median (dots: max)"],
                           ["sw-low", "\u03b8 low"], ["sw-high", "\u03b8 high"], ["sw-core", "core"],
                           ["sw-buffer", "buffer"], ["sw-drop", "drop"]]);
    gateChart(gate);
    histChart(gate);
  }

  function renderDecisions(data) {
    var body = clear(document.querySelector("#decisions tbody"));
    var latest = (data.gate && data.gate.latest) || [];
    $("decisions-note").textContent = latest.length ? "" :
      "no decisions to show because none of this tenant reached the memories topic since the feed started";
    latest.forEach(function (d) {
      body.appendChild(row([fmtWhen(d.ts), d.agent_id || "", d.memory_id, d.kind, d.route || "",
                            d.reason, num(d.score), fmtNum(d.theta_low) + " / " + fmtNum(d.theta_high)],
                           { "data-route": d.route || "", "class": "decision" }));
    });
  }

  function renderDead(data) {
    var body = clear(document.querySelector("#dead tbody"));
    if (data.dead_letters === null) {
      $("dead-note").textContent = data.dead_letters_note || "not available to this token";
      return;
    }
    $("dead-note").textContent = data.dead_letters.length ? "" :
      "no dead letters since this worker's feed started (every record so far was valid)";
    data.dead_letters.forEach(function (d) {
      body.appendChild(row([fmtTime(d.ts), d.stage, d.topic + ":" + d.partition + "@" + d.offset,
                            d.error_type, d.reason]));
    });
  }

  // ------------------------------------------------------------------ search
  function bar(parts, width, label) {
    var h = 14, g = svg("svg", { width: width + 200, height: h + 2, viewBox: "0 0 " + (width + 200) + " " + (h + 2),
                                 "class": "bar" });
    g.appendChild(svg("rect", { x: 0, y: 1, width: width, height: h, fill: "#f0f0f0" }));
    var x = 0;
    parts.forEach(function (p) {
      var w = Math.max(0, Math.min(1, p.v)) * width;
      var r = svg("rect", { x: x, y: 1, width: w, height: h, fill: p.color, "class": "bar-" + p.name,
                            "data-value": p.v });
      r.appendChild(svg("title", null, p.name + " " + fmtNum(p.v)));
      g.appendChild(r);
      x += w;
    });
    g.appendChild(svg("text", { x: width + 6, y: h - 2, "class": "bar-label" }, label));
    return g;
  }

  function renderHits(resp) {
    var list = clear($("hits"));
    var hits = resp.hits || [];
    $("search-note").textContent = hits.length ? "took " + fmtNum(resp.took_ms, 1) + " ms; " +
      "score = \u03bb\u00b7semantic + (1\u2212\u03bb)\u00b7salience\u00b7recency"
      : "no hits: this tenant has no stored memories yet";
    legend("hits-legend", hits.length ? [["sw-semantic", "\u03bb \u00b7 semantic"],
                                         ["sw-prior", "(1\u2212\u03bb) \u00b7 salience \u00b7 recency"]] : []);
    hits.forEach(function (h, i) {
      var b = h.breakdown || {}, lam = b["lambda"];
      var li = el("li", { "class": "hit", "data-memory-id": h.memory_id, "data-score": h.score });
      var head = el("div", { "class": "hit-head" });
      head.appendChild(el("span", { "class": "badge " + h.partition }, h.partition));
      head.appendChild(document.createTextNode(" score " + fmtNum(h.score) + " \u00b7 reward " +
        fmtNum(h.reward, 2) + " \u00b7 rpe " + fmtNum(h.rpe, 2) + " \u00b7 utility " + fmtNum(h.utility, 2) +
        " \u00b7 " + h.agent_id + " " +
        h.episode_id + ":" + h.step + " \u00b7 " + fmtTime(h.created_ts)));
      li.appendChild(head);
      li.appendChild(el("div", { "class": "hit-text" }, h.text + "  \u2192 " + h.action));
      var sem = lam * b.semantic, prior = (1 - lam) * b.salience * b.recency;
      li.appendChild(bar([{ name: "semantic-part", v: sem, color: "#1f77b4" },
                          { name: "prior-part", v: prior, color: "#ff7f0e" }], 300,
                         "score " + fmtNum(b.score) + " (\u03bb " + fmtNum(lam, 2) + ")"));
      [["semantic", "#6baed6"], ["salience", "#fdae6b"], ["recency", "#74c476"]].forEach(function (p) {
        li.appendChild(bar([{ name: p[0], v: b[p[0]], color: p[1] }], 300, p[0] + " " + fmtNum(b[p[0]])));
      });
      list.appendChild(li);
    });
  }

  function search(query, k) {
    if (!state.tenant) { $("search-note").textContent = "select a tenant first"; return; }
    document.body.setAttribute("data-search", "running");
    var gen = state.gen;
    api("POST", "/v1/search", { tenant: state.tenant, query: query, k: k }).then(function (r) {
      if (gen !== state.gen) { return; }
      if (r.status !== 200) {
        $("search-note").textContent = "search failed (" + r.status + "): " + ((r.body && r.body.error) || "");
        document.body.setAttribute("data-search", "error");
        if (r.status === 401) { needToken(r.body); }
        return;
      }
      renderHits(r.body);
      document.body.setAttribute("data-search", "done");
      document.body.setAttribute("data-hits", (r.body.hits || []).length);
    }, function (e) {
      $("search-note").textContent = "search failed: " + e;
      document.body.setAttribute("data-search", "error");
    });
  }

  // ------------------------------------------------------------------ polling
  // what the page shows of a tenant goes when the token or the tenant changes, or the
  // server refuses the token: never one tenant's memories under another's credentials
  function wipe() {
    state.gen += 1;  // answers to requests made before are dropped
    ["#tenants tbody", "#decisions tbody", "#dead tbody"].forEach(function (q) {
      clear(document.querySelector(q));
    });
    ["gate-chart", "routes-chart", "hist-chart", "gate-legend", "hits", "hits-legend"].forEach(function (id) {
      clear($(id));
    });
    ["tenants-note", "gate-note", "decisions-note", "dead-note", "search-note"].forEach(function (id) {
      $(id).textContent = "";
    });
    ["gate-tenant", "decisions-tenant", "search-tenant"].forEach(function (id) { $(id).textContent = ""; });
    if (window.dmemExplorer) { window.dmemExplorer.reset(); }
  }

  function needToken(body) {
    wipe();
    document.body.setAttribute("data-state", "auth");
    $("auth").hidden = false;
    setStatus((token() ? "token refused: " : "this deployment needs an API token: ") +
              ((body && body.error) || ""), true);
  }

  function select(tenant) {
    state.tenant = tenant;
    state.refused = null;
    var p = new URLSearchParams(window.location.search);
    p.set("tenant", tenant);
    p.delete("q");
    history.replaceState(null, "", window.location.pathname + "?" + p.toString());
    clear($("hits")); $("search-note").textContent = ""; clear($("hits-legend"));
    poll();
  }

  function poll() {
    if (state.timer) { clearTimeout(state.timer); state.timer = null; }
    var path = "/v1/live" + (state.tenant ? "?tenant=" + encodeURIComponent(state.tenant) : "");
    var gen = state.gen;
    api("GET", path).then(function (r) {
      if (gen !== state.gen) { return; }  // asked under a token or tenant since left
      if (r.status === 401) { needToken(r.body); return; }
      if (r.status === 403 && state.tenant) {
        // a tenant this token may not read: nothing of it is shown; the page goes back
        // to the tenants the token may read, and says why
        var refused = state.tenant;
        wipe();
        state.tenant = null;
        state.refused = "token not allowed for tenant " + refused + "; showing this token's tenants";
        poll();
        return;
      }
      if (r.status !== 200) {
        wipe();
        document.body.setAttribute("data-state", "error");
        setStatus("GET /v1/live answered " + r.status + ": " + ((r.body && r.body.error) || ""), true);
      } else {
        var data = r.body;
        state.tenant = data.tenant;
        if (window.dmemExplorer) { window.dmemExplorer.tenant(data.tenant); }
        renderTenants(data); renderGate(data); renderDecisions(data); renderDead(data);
        var feed = data.feed || {};
        setStatus((state.refused ? state.refused + " \u00b7 " : "") + "updated " + fmtTime(data.now_ms) +
                  " \u00b7 feed " +
                  (feed.enabled ? (feed.running ? "running" : "paused" + (feed.error ? ": " + feed.error : ""))
                                : "off") +
                  (feed.events_seen === undefined ? "" : " \u00b7 " + feed.events_seen + " events read"),
                  Boolean(state.refused));
        document.body.setAttribute("data-state", "ready");
        if (state.autoQuery && data.tenant) {
          var q = state.autoQuery;
          state.autoQuery = null;
          $("q").value = q;
          search(q, parseInt($("k").value, 10) || 5);
        }
      }
      state.timer = setTimeout(poll, POLL_MS);
    }, function (e) {
      if (gen !== state.gen) { return; }
      document.body.setAttribute("data-state", "error");
      setStatus("worker unreachable: " + e, true);
      state.timer = setTimeout(poll, POLL_MS);
    });
  }

  // the memory explorer (explorer.js) shares the token and the helpers
  window.dmemUi = { api: api, el: el, svg: svg, clear: clear, fmtTime: fmtTime, fmtWhen: fmtWhen, fmtNum: fmtNum,
                    needToken: needToken };

  document.addEventListener("DOMContentLoaded", function () {
    $("auth").addEventListener("submit", function (ev) {
      ev.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      $("auth").hidden = true;
      wipe();
      state.refused = null;
      poll();
    });
    $("forget-token").addEventListener("click", function () {
      sessionStorage.removeItem(TOKEN_KEY);
      needToken(null);
    });
    window.addEventListener("hashchange", function () {
      if (takeFragment()) { wipe(); state.refused = null; $("auth").hidden = true; poll(); }
    });
    $("search").addEventListener("submit", function (ev) {
      ev.preventDefault();
      search($("q").value, parseInt($("k").value, 10) || 5);
    });
    poll();
  });
})();
