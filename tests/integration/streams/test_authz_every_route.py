"""Every route of the HTTP API checks the tenant: a guard over the whole router.

The routes come from the worker's aiohttp router (`streams.app.build_app` with the
``all`` role, the app the worker under test serves), so a route added later is
probed without editing this file; each request is built from the served
``/openapi.json`` (required parameters and body fields with valid dummy values, the
tenant set to the target). Against the real stack (Tansu broker, Milvus Lite, one
``dmem worker --role all`` with bearer tokens), for every (method, path):

- no token: 401, except the routes listed in `PUBLIC`, and that list is exactly the
  set of routes that answer without one (a HEAD on a route without GET runs no
  handler: faust answers 405 to every caller);
- tenant alpha's token acting on tenant beta: 403;
- alpha's token on alpha, and the all-tenant token on beta: neither 401 nor 403;
- no answer to a request without a token or with alpha's token carries beta's
  memory (its text), nor its id unless the request itself sent that id.

Beta holds one memory before the probes; alpha's requests aim at it (its id and
episode in the path or body, under beta's and under alpha's own tenant). After the
write path settled, the all-tenant token finds it unchanged (not forgotten, never
fed back or credited) and no record alpha sent for beta, while the record the
all-tenant token wrote for beta is there (so the write path did run).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dmem.wait import wait_settled
from streams.local.stack import LocalStack
from tests.integration.broker_fixtures import tokened_stack

pytestmark = pytest.mark.integration

ALPHA, BETA = "alpha", "beta"
TOKENS = {"tok-alpha": [ALPHA], "tok-ops": ["*"]}
#: the routes that answer without a token (documented open: probes, scrapers, the
#: API document, the live page's shell and its static files; none holds tenant data)
PUBLIC = frozenset(
    (method, path)
    for path in ("/health", "/metrics", "/openapi.json", "/ui", "/ui/", "/ui/static/{name}")
    for method in ("GET", "HEAD")
)
#: path parameters of routes the document does not describe (the public static files)
PATH_DEFAULTS = {"name": "ui.js"}
#: statuses a permitted request may get: served, accepted, or no such memory (a dummy
#: id, or beta's id under alpha's tenant); not 422: a request built from the document
#: is valid, or the document does not describe the route
PERMITTED = frozenset({200, 202, 404})
SECRET = f"vault-{uuid.uuid4().hex[:12]}"
FORGED = f"forged-{uuid.uuid4().hex[:12]}"
OWN = f"own-{uuid.uuid4().hex[:12]}"
OPS_WRITE = f"opswrite-{uuid.uuid4().hex[:12]}"
BETA_EPISODE = "beta-ep"
IDENT = "^[A-Za-z0-9_.:@/-]+$"


@dataclass(frozen=True)
class Target:
    """What a probe fills into the request: the tenant, the memory and episode ids
    aimed at, and the text of any record it writes."""

    tenant: str
    memory_id: str
    episode_id: str
    marker: str


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


@dataclass(frozen=True)
class Probe:
    method: str
    url: str
    body: bytes | None


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, broker: str) -> Iterator[LocalStack]:
    prefix = f"t{uuid.uuid4().hex[:8]}."
    with tokened_stack(tmp_path_factory.mktemp("authz") / "data", broker, prefix, TOKENS) as s:
        yield s


def call(method: str, url: str, body: bytes | None = None, token: str | None = None) -> Answer:
    """One request; an error status is an answer like any other (`Answer`)."""
    auth = {} if token is None else {"Authorization": f"Bearer {token}"}
    req = urllib.request.Request(url, body, {"Content-Type": "application/json", **auth},
                                 method=method)  # fmt: skip
    try:
        r = urllib.request.urlopen(req, timeout=30)
    except urllib.error.HTTPError as e:  # 4xx and 5xx: the same file-like answer
        r = e
    with r:
        return Answer(r.getcode(), r.read())


def served_routes(stack: LocalStack) -> set[tuple[str, str]]:
    """(method, path template) of every route the worker's router holds."""
    from streams.app import build_app

    # the served port: the stack's client-side settings leave it 0 (any free one)
    settings = stack.settings.model_copy(update={"web_port": stack.web_ports[0]})
    web: Any = build_app(settings, "all").web  # faust's aiohttp driver: its web_app
    return {(r.method, r.resource.canonical) for r in web.web_app.router.routes()
            if r.resource is not None}  # fmt: skip


def sent(param: dict[str, Any]) -> bool:
    """Whether a probe sends this query parameter: the required ones, and the tenant."""
    return param["in"] == "query" and bool(param.get("required") or param["name"] == "tenant")


class Builder:
    """Requests for one route from its operation in the OpenAPI document."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.paths: dict[str, Any] = document["paths"]
        self.components: dict[str, Any] = document["components"]["schemas"]

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = self.components[schema["$ref"].rsplit("/", 1)[-1]]
        for key in ("oneOf", "anyOf"):  # the first option that is an object or a value
            if key in schema:
                options = [self.resolve(o) for o in schema[key] if o.get("type") != "null"]
                objects = [o for o in options if o.get("type") == "object" or "properties" in o]
                return (objects or options)[0]
        return schema

    @staticmethod
    def aimed(t: Target) -> dict[str, Any]:
        """The fields, wherever a schema declares them (required or not), that aim a
        request at the target: its tenant, memory and episode, a record with effect."""
        return {
            "tenant": t.tenant,
            "memory_id": t.memory_id,
            "ids": [t.memory_id],
            "memory_ids": [t.memory_id],
            "weights": [1.0],
            "episode_id": t.episode_id,
            "observation": f"{t.marker} at the vault door",
            "query": "the vault door",
            "reward": 5.0,
            "value": 5.0,
        }

    def value(self, name: str, schema: dict[str, Any], t: Target) -> Any:
        """A valid value for field ``name``: the target's where the field names one."""
        aimed = self.aimed(t)
        if name in aimed:
            return aimed[name]
        return self.dummy(self.resolve(schema), t)

    def dummy(self, schema: dict[str, Any], t: Target) -> Any:
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return schema["enum"][0]
        kind = schema.get("type")
        if kind == "object" or "properties" in schema:
            props = schema.get("properties", {})
            names = [*schema.get("required", []), *(k for k in self.aimed(t) if k in props)]
            return {k: self.value(k, props.get(k, {}), t) for k in dict.fromkeys(names)}
        if kind == "array":
            item = self.resolve(schema.get("items", {}))
            return [self.dummy(item, t) for _ in range(schema.get("minItems", 0))]
        if kind in ("integer", "number"):
            return max(schema.get("minimum", 0), 0)
        if kind == "boolean":
            return False
        if kind == "string":
            pattern = schema.get("pattern")
            assert pattern in (None, IDENT), f"no dummy value for pattern {pattern!r}: add one"
            return "dummy"
        raise AssertionError(f"no dummy value for schema {schema!r}: add one")

    def probe(self, base: str, method: str, path: str, t: Target) -> Probe:
        op = self.paths.get(path, {}).get("get" if method == "HEAD" else method.lower(), {})
        params = op.get("parameters", [])
        route = path
        for name in (seg[1:-1] for seg in path.split("/") if seg.startswith("{")):
            spec = next((p for p in params if p["in"] == "path" and p["name"] == name), None)
            raw = PATH_DEFAULTS.get(name) if spec is None else self.value(name, spec["schema"], t)
            route = route.replace("{" + name + "}", urllib.parse.quote(str(raw), safe=""))
        query = {p["name"]: self.value(p["name"], p["schema"], t) for p in params if sent(p)}
        url = base + route + ("?" + urllib.parse.urlencode(query) if query else "")
        body = None
        content = op.get("requestBody", {}).get("content", {})
        if "application/json" in content:
            payload = self.dummy(self.resolve(content["application/json"]["schema"]), t)
            body = json.dumps(payload).encode()
        return Probe(method, url, body)

    def takes_tenant(self, method: str, path: str) -> bool:
        op = self.paths.get(path, {}).get("get" if method == "HEAD" else method.lower(), {})
        if any(p["name"] == "tenant" for p in op.get("parameters", [])):
            return True
        content = op.get("requestBody", {}).get("content", {})
        if "application/json" not in content:
            return False
        return "tenant" in self.resolve(content["application/json"]["schema"]).get("properties", {})


def ops(base: str, method: str, path: str, body: Any = None) -> Any:
    sent = None if body is None else json.dumps(body).encode()
    a = call(method, base + path, sent, "tok-ops")
    assert a.status in (200, 202), (method, path, a)
    return json.loads(a.body)


def seed_beta(base: str) -> dict[str, Any]:
    """Beta's one memory (its row, read back with the all-tenant token)."""

    def tr(step: int, text: str, reward: float) -> dict[str, Any]:
        return {"tenant": BETA, "agent_id": "beta-agent", "episode_id": BETA_EPISODE,
                "step": step, "observation": text, "action": "open", "reward": reward,
                "metadata": {"secret": SECRET}}  # fmt: skip

    ops(base, "POST", "/v1/transitions", [
        tr(0, "walking the quiet corridor", -0.1),
        tr(1, f"{SECRET} the vault door opens to the code", 20.0),
        tr(2, "walking the quiet corridor again", -0.1),
    ])  # fmt: skip
    wait_settled([base], timeout_s=60)
    page = ops(base, "GET", f"/v1/memories?tenant={BETA}&limit=50")
    rows = [m for m in page["memories"] if SECRET in str(m.get("text"))]
    assert rows, page
    return dict(rows[0])


def no_leak(what: Any, answer: Answer, probe: Probe, beta_id: str) -> None:
    assert SECRET.encode() not in answer.body, ("beta's memory in the answer", what, answer)
    if beta_id.encode() not in (probe.body or b"") + probe.url.encode():
        assert beta_id.encode() not in answer.body, ("beta's memory id in the answer", what)


def test_every_route_checks_the_tenant(stack: LocalStack) -> None:
    base = f"http://127.0.0.1:{stack.web_ports[0]}"
    document = json.loads(call("GET", base + "/openapi.json").body)
    builder = Builder(document)
    routes = served_routes(stack)
    with_get = {path for method, path in routes if method == "GET"}
    no_handler = {(m, p) for m, p in routes if m == "HEAD" and p not in with_get}
    guarded = routes - PUBLIC - no_handler
    documented = {(m.upper(), p) for p, ops_ in document["paths"].items() for m in ops_}
    # each guarded route's request comes from the document: it must describe all of them
    undocumented = sorted((m, p) for m, p in guarded if m != "HEAD" and (m, p) not in documented)
    assert undocumented == [], "routes with no request to build (not in /openapi.json)"
    assert documented <= routes, "the document describes routes the worker does not serve"
    untenanted = sorted(r for r in guarded if not builder.takes_tenant(*r))
    assert untenanted == [], "routes that name no tenant cannot be scoped to one"

    beta_row = seed_beta(base)
    beta_id = beta_row["memory_id"]
    beta_history = ops(base, "GET", f"/v1/memories/{beta_id}/history?tenant={BETA}")["events"]
    at_beta = Target(BETA, beta_id, BETA_EPISODE, FORGED)
    at_own = Target(ALPHA, beta_id, BETA_EPISODE, OWN)  # alpha's tenant, beta's ids
    ops_at_beta = Target(BETA, "m-dummy", "e-dummy", OPS_WRITE)

    answering: set[tuple[str, str]] = set()
    for route in sorted(routes):
        method, path = route
        p = builder.probe(base, method, path, at_beta)
        a = call(method, p.url, p.body)
        no_leak((route, "no token"), a, p, beta_id)
        if route in no_handler:
            assert a.status == 405, (route, a)
            continue
        if a.status != 401:
            answering.add(route)
            assert a.status == 200, (route, a)
            continue
        a = call(method, p.url, p.body, "tok-alpha")
        assert a.status == 403, (route, "alpha's token on beta", a)
        no_leak((route, "alpha on beta"), a, p, beta_id)
        p = builder.probe(base, method, path, at_own)
        a = call(method, p.url, p.body, "tok-alpha")
        assert a.status in PERMITTED, (route, "alpha's token on alpha", a)
        no_leak((route, "alpha on alpha"), a, p, beta_id)
        p = builder.probe(base, method, path, ops_at_beta)
        a = call(method, p.url, p.body, "tok-ops")
        assert a.status in PERMITTED, (route, "all-tenant token on beta", a)
    assert answering == PUBLIC & routes
    assert PUBLIC <= routes, f"listed as public but not served: {sorted(PUBLIC - routes)}"

    # nothing alpha sent reached beta; what the all-tenant token wrote did
    wait_settled([base], timeout_s=60)
    row = ops(base, "GET", f"/v1/memories/{beta_id}?tenant={BETA}")
    assert row["utility"] == beta_row["utility"] and row["text"] == beta_row["text"]
    history = ops(base, "GET", f"/v1/memories/{beta_id}/history?tenant={BETA}")["events"]
    assert [e["kind"] for e in history] == [e["kind"] for e in beta_history]
    texts = [str(m.get("text")) for m in
             ops(base, "GET", f"/v1/memories?tenant={BETA}&limit=500")["memories"]]  # fmt: skip
    assert any(OPS_WRITE in t for t in texts), texts
    assert not any(FORGED in t or OWN in t for t in texts), texts
    hits = ops(base, "POST", "/v1/search", {"tenant": BETA, "query": f"{FORGED} vault door",
                                            "k": 20})["hits"]  # fmt: skip
    assert not any(FORGED in h["text"] or OWN in h["text"] for h in hits), hits
    print(f"routes probed: {len(routes)} ({len(guarded)} guarded, {len(PUBLIC)} public, "
          f"{len(no_handler)} HEAD without GET)")  # fmt: skip
