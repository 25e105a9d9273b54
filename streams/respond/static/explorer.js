// dmem memory explorer: a tenant's memories (GET /v1/memories), one memory's detail and
// history (GET /v1/memories/{id}, /history), thumbs (POST /v1/feedback) and forget
// (DELETE /v1/memories/{id}). Uses ui.js's helpers and token (window.dmemUi); every
// value from the server is written with textContent or as an SVG attribute.
(function () {
  "use strict";

  var ui = null;
  // a list right after a forget does not hold the forgotten row: the server leaves ids it
  // forgot out of every read (milvus.tombstones), though its reads are bounded-stale
  var st = { tenant: null, cursors: [null], page: 0, next: null, rows: [], open: null, events: [] };
  var WAIT_MS = 20000, STEP_MS = 700;

  function $(id) { return document.getElementById(id); }
  function enc(s) { return encodeURIComponent(s); }
  function mark(name, value) { document.body.setAttribute("data-" + name, value); }

  function query() {
    var q = ["tenant=" + enc(st.tenant), "limit=" + enc($("f-limit").value)];
    var agent = $("f-agent").value.trim(), part = $("f-partition").value;
    var val = $("f-valence").value, util = $("f-utility").value.trim();
    var meta = $("f-meta").value.trim();
    if (agent) { q.push("agent_id=" + enc(agent)); }
    if (part) { q.push("partition=" + enc(part)); }
    if (val) { q.push("valence=" + enc(val)); }
    if (util) { q.push("min_utility=" + enc(util)); }
    if (meta) {
      var i = meta.indexOf("=");
      if (i <= 0) { return null; }  // said to the user by load(), never dropped quietly
      q.push("meta." + enc(meta.slice(0, i).trim()) + "=" + enc(meta.slice(i + 1).trim()));
    }
    var c = st.cursors[st.page];
    if (c) { q.push("cursor=" + enc(c)); }
    return q.join("&");
  }

  function load() {
    if (!st.tenant) { return; }
    var qs = query();
    if (qs === null) {
      $("mem-note").textContent = "the metadata filter must be key=value (for example speaker=user)";
      mark("explorer", "error");
      return;
    }
    mark("explorer", "loading");
    var mine = st;  // an answer for a listing that was reset since is dropped
    ui.api("GET", "/v1/memories?" + qs).then(function (r) {
      if (mine !== st) { return; }
      if (r.status === 401) { ui.needToken(r.body); return; }
      if (r.status !== 200) {
        $("mem-note").textContent = "GET /v1/memories answered " + r.status + ": " +
          JSON.stringify((r.body && (r.body.detail || r.body.error)) || "");
        mark("explorer", "error");
        return;
      }
      st.rows = r.body.memories || [];
      st.next = r.body.next_cursor;
      render();
      mark("explorer", "ready");
    }, function (e) {
      if (mine !== st) { return; }
      $("mem-note").textContent = "list failed: " + e; mark("explorer", "error");
    });
  }

  function render() {
    var body = ui.clear(document.querySelector("#memories tbody"));
    $("explorer-tenant").textContent = st.tenant || "";
    $("mem-note").textContent = st.rows.length
      ? "page " + (st.page + 1) + ": " + st.rows.length + " memories, newest first"
      : (st.page ? "no older memories" : "no memories match (the gate keeps only surprising steps)");
    st.rows.forEach(function (m) {
      var tr = ui.el("tr", { "class": "memory", tabindex: "0", "data-memory-id": m.memory_id,
                             "data-utility": m.utility });
      [ui.fmtWhen(m.created_ts), m.agent_id, m.partition].forEach(function (v) {
        tr.appendChild(ui.el("td", null, v));
      });
      tr.appendChild(ui.el("td", { "class": "text", title: m.text }, m.text));
      tr.appendChild(ui.el("td", null, m.action));
      [[m.reward, 2], [m.utility, 3], [m.valence, 0]].forEach(function (v) {
        tr.appendChild(ui.el("td", { "class": "num" }, ui.fmtNum(v[0], v[1])));
      });
      tr.addEventListener("click", function () { open(m.memory_id); });
      tr.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); open(m.memory_id); }
        else if (ev.key === "ArrowDown" && tr.nextSibling) { ev.preventDefault(); tr.nextSibling.focus(); }
        else if (ev.key === "ArrowUp" && tr.previousSibling) { ev.preventDefault(); tr.previousSibling.focus(); }
      });
      body.appendChild(tr);
    });
    $("mem-newer").disabled = st.page === 0;
    $("mem-older").disabled = !st.next;
  }

  function fact(dl, name, value) {
    dl.appendChild(ui.el("dt", null, name));
    dl.appendChild(ui.el("dd", null, value));
  }

  function describe(e) {
    var skip = { kind: 1, ts: 1, tenant: 1, memory_id: 1, schema_version: 1, processed_ts: 1 };
    return Object.keys(e).filter(function (k) { return !skip[k] && e[k] !== null; })
      .map(function (k) {
        var v = e[k];
        return k + " " + (typeof v === "number" ? ui.fmtNum(v, Number.isInteger(v) ? 0 : 3) : String(v));
      }).join(" \u00b7 ");
  }

  // utility after each credit or thumbs, from the history (a small line plot)
  function plot(m, events) {
    var box = ui.clear($("d-plot"));
    var pts = [];
    events.forEach(function (e) {
      if (e.utility_after !== undefined) {
        if (!pts.length && e.utility_before !== undefined) { pts.push([e.ts - 1, e.utility_before]); }
        pts.push([e.ts, e.utility_after]);
      }
    });
    if (!pts.length) {
      box.appendChild(ui.el("p", { "class": "note" }, "no credit yet: utility " + ui.fmtNum(m.utility)));
      return;
    }
    var W = 360, H = 90, P = 24;
    var t0 = pts[0][0], t1 = pts[pts.length - 1][0];
    var ys = pts.map(function (p) { return p[1]; }).concat([0]);
    var lo = Math.min.apply(null, ys), hi = Math.max.apply(null, ys);
    if (hi - lo < 1e-6) { hi = lo + 1; }
    function sx(t) { return P + (t1 > t0 ? (t - t0) / (t1 - t0) : 0.5) * (W - 2 * P); }
    function sy(v) { return H - P / 2 - (v - lo) / (hi - lo) * (H - P); }
    var s = ui.svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img",
                            "aria-label": "utility over time", id: "d-plot-svg" });
    s.appendChild(ui.svg("line", { x1: P, x2: W - P, y1: sy(0), y2: sy(0), "class": "grid" }));
    s.appendChild(ui.svg("text", { x: 2, y: sy(hi) + 4, "class": "bar-label" }, ui.fmtNum(hi, 2)));
    s.appendChild(ui.svg("text", { x: 2, y: sy(lo) + 4, "class": "bar-label" }, ui.fmtNum(lo, 2)));
    s.appendChild(ui.svg("polyline", { "class": "plot-line",
      points: pts.map(function (p) { return sx(p[0]) + "," + sy(p[1]); }).join(" ") }));
    pts.forEach(function (p) {
      var c = ui.svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3, "class": "plot-dot" });
      c.appendChild(ui.svg("title", null, ui.fmtTime(p[0]) + " utility " + ui.fmtNum(p[1])));
      s.appendChild(c);
    });
    box.appendChild(s);
  }

  function show(m, events) {
    st.events = events;
    var d = $("mem-detail");
    d.hidden = false;
    d.setAttribute("data-memory-id", m.memory_id);
    d.setAttribute("data-utility", m.utility);
    $("d-id").textContent = m.memory_id + (m.folded_id ? " (asked: " + m.folded_id + ")" : "");
    var badge = $("d-partition");
    badge.textContent = m.partition;
    badge.className = "badge " + m.partition;
    $("d-text").textContent = m.text;
    var dl = ui.clear($("d-facts"));
    fact(dl, "action", m.action);
    fact(dl, "reward", ui.fmtNum(m.reward, 3));
    fact(dl, "valence", String(m.valence));
    var credited = (m.metadata && m.metadata.credit && m.metadata.credit.n) || 0;
    fact(dl, "utility", ui.fmtNum(m.utility, 4) + " from " + credited +
         " credited uses and thumbs (" + m.uses + " uses in credited episodes)");
    fact(dl, "surprise", "rpe " + ui.fmtNum(m.rpe, 3) + ", gate score " + ui.fmtNum(m.rpe_smoothed, 3));
    fact(dl, "agent / episode:step", m.agent_id + " / " + m.episode_id + ":" + m.step);
    fact(dl, "created", new Date(m.created_ts).toISOString());
    var user = (m.metadata && m.metadata.user) || {};
    fact(dl, "metadata", Object.keys(user).length ? JSON.stringify(user) : "\u2013");
    var written = events.filter(function (e) { return e.kind === "written"; })[0];
    $("d-why").textContent = written
      ? "routed to " + written.route + ": " + (written.reason || "") + " (gate score " +
        ui.fmtNum(written.rpe_smoothed) + ", \u03b8 low " + ui.fmtNum(written.theta_low) +
        ", \u03b8 high " + ui.fmtNum(written.theta_high) + ")"
      : "no write event recorded for it (written before the history was kept)";
    $("d-merged").textContent = (m.merged_ids || []).length
      ? m.merged_count + " transitions: " + m.merged_ids.join(", ") : "none (merged_count " + m.merged_count + ")";
    plot(m, events);
    var body = ui.clear(document.querySelector("#d-history tbody"));
    events.slice().reverse().forEach(function (e) {
      var tr = ui.el("tr", { "data-kind": e.kind });
      tr.appendChild(ui.el("td", null, new Date(e.ts).toISOString()));
      tr.appendChild(ui.el("td", null, e.kind));
      tr.appendChild(ui.el("td", null, describe(e)));
      body.appendChild(tr);
    });
  }

  function fetchDetail(id) {
    var base = "/v1/memories/" + enc(id);
    return Promise.all([
      ui.api("GET", base + "?tenant=" + enc(st.tenant)),
      ui.api("GET", base + "/history?tenant=" + enc(st.tenant)),
    ]);
  }

  function open(id) {
    st.open = id;
    $("d-note").textContent = "";
    $("d-forget-yes").hidden = true;
    mark("detail", "loading");
    var mine = st;
    fetchDetail(id).then(function (rs) {
      if (mine !== st || st.open !== id) { return; }  // reset, or another one opened
      if (rs[0].status !== 200) {
        $("d-note").textContent = "GET memory answered " + rs[0].status;
        mark("detail", "missing");
        return;
      }
      show(rs[0].body, rs[1].status === 200 ? rs[1].body.events : []);
      mark("detail", "ready");
      $("mem-detail").focus();
    }, failed("detail", "opening the memory", mine));
  }

  // a request that never got an answer (worker down, network): said, not swallowed
  function failed(what, doing, mine) {
    return function (e) {
      if (mine !== st) { return; }  // the page was reset since: not this tenant's news
      $("mem-detail").hidden = false;
      $("d-note").textContent = doing + " failed: " + e;
      mark(what, "error");
    };
  }

  function feedbackEvents(events) {
    return (events || []).filter(function (e) { return e.kind === "fed_back"; }).length;
  }

  // rate: send the thumbs, then re-read until the memory's history holds the feedback
  // (the credit job applied it; the utility may not move: one already at 1 stays there)
  function rate(kind) {
    var id = st.open, before = parseFloat($("mem-detail").getAttribute("data-utility"));
    var mine = st, seen = 0;
    var body = { tenant: st.tenant, memory_id: id, kind: kind, value: kind === "thumbs_up" ? 1 : -1 };
    mark("rating", "sent");
    // the feedback already in the history, read now: the one sent is the next
    fetchDetail(id).then(function (rs) {
      seen = feedbackEvents(rs[1].status === 200 ? rs[1].body.events : st.events);
      if (rs[0].status === 200) { before = rs[0].body.utility; }
      return ui.api("POST", "/v1/feedback", body);
    }).then(function (r) {
      if (mine !== st) { return; }
      if (r.status !== 202) { $("d-note").textContent = "feedback answered " + r.status; mark("rating", "error"); return; }
      $("d-note").textContent = "thanks: waiting for the credit job\u2026";
      var until = Date.now() + WAIT_MS;
      (function again() {
        if (mine !== st || st.open !== id) { return; }  // reset, or another memory open
        fetchDetail(id).then(function (rs) {
          if (mine !== st || st.open !== id) { return; }
          var events = rs[1].status === 200 ? rs[1].body.events : [];
          if (rs[0].status === 200 && (feedbackEvents(events) > seen || rs[0].body.utility !== before)) {
            show(rs[0].body, events);
            $("d-note").textContent = "applied: utility " + ui.fmtNum(before) + " \u2192 " +
              ui.fmtNum(rs[0].body.utility);
            mark("rating", "applied");
            var tr = document.querySelector('#memories tr[data-memory-id="' + CSS.escape(id) + '"]');
            if (tr) { tr.setAttribute("data-utility", rs[0].body.utility); tr.children[6].textContent = ui.fmtNum(rs[0].body.utility, 3); }
          } else if (Date.now() < until) {
            setTimeout(again, STEP_MS);
          } else {
            $("d-note").textContent = "sent; the credit job has not applied it yet (it will shortly)";
            mark("rating", "pending");
          }
        }, failed("rating", "reading the memory again", mine));
      })();
    }, failed("rating", "sending the feedback", mine));
  }

  function forget() {
    var id = st.open, mine = st;
    ui.api("DELETE", "/v1/memories/" + enc(id) + "?tenant=" + enc(st.tenant)).then(function (r) {
      if (mine !== st) { return; }
      if (r.status !== 200) { $("d-note").textContent = "forget answered " + r.status; return; }
      $("mem-detail").hidden = true;
      st.open = null;
      mark("forgot", id);
      load();
    }, failed("forgot", "forgetting the memory", mine));
  }

  function reset() {
    st = { tenant: null, cursors: [null], page: 0, next: null, rows: [], open: null, events: [] };
    if (!ui) { return; }  // nothing drawn yet
    $("mem-filters").reset();  // one tenant's filters are not the next one's
    $("mem-detail").hidden = true;
    render();
    $("d-note").textContent = "";
    $("mem-note").textContent = "";
  }

  window.dmemExplorer = {
    tenant: function (t) {
      if (!t || t === st.tenant) { return; }
      reset();
      st.tenant = t;
      load();
    },
    reset: reset,
  };

  document.addEventListener("DOMContentLoaded", function () {
    ui = window.dmemUi;
    $("mem-filters").addEventListener("submit", function (ev) {
      ev.preventDefault(); st.cursors = [null]; st.page = 0; load();
    });
    $("mem-older").addEventListener("click", function () {
      if (!st.next) { return; }
      st.cursors[st.page + 1] = st.next; st.page += 1; load();
    });
    $("mem-newer").addEventListener("click", function () {
      if (st.page > 0) { st.page -= 1; load(); }
    });
    $("mem-refresh").addEventListener("click", load);
    $("d-up").addEventListener("click", function () { rate("thumbs_up"); });
    $("d-down").addEventListener("click", function () { rate("thumbs_down"); });
    $("d-forget").addEventListener("click", function () { $("d-forget-yes").hidden = false; $("d-forget-yes").focus(); });
    $("d-forget-yes").addEventListener("click", forget);
    $("d-close").addEventListener("click", function () { $("mem-detail").hidden = true; st.open = null; });
    $("mem-detail").addEventListener("keydown", function (ev) {
      if (ev.key === "Escape") { $("mem-detail").hidden = true; st.open = null; }
    });
  });
})();
