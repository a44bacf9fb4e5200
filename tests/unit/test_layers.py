"""The runtime's layering, enforced by reading imports (docs/architecture.md, runtime/ports.py).

Every `import`/`from ... import` in `src/hutch` is read with `ast`, including those under
`if TYPE_CHECKING:` and inside functions. The rules:
- the pure packages (amqp, core, queues, raft, storage, cluster, streamproto) never import runtime, mgmt or
  cli, and streamproto imports nothing of hutch but itself (stdlib only);
- in the runtime: `session/` never imports the broker's node, `clustering/`, `queue_types/` or `app`;
  `broker/` never imports `session/`, `queue_types/`, `clustering/` or `app`; `clustering/` never imports
  `broker/`, `queue_types/`, `session/` or `app`; `queue_types/` never imports `session/`, `stream_session/`
  or `app`; `stream_session/` never imports the broker's node, `clustering/`, `app` or the AMQP session
  beyond its ports; `workers/` (the supervisor and a worker's control link) never imports `broker/`,
  `session/`, `queue_types/`, `clustering/` or `app` (a worker hands its link the transport's `adopt`);
- only `cli/server.py` imports `runtime/app.py` (the composition root);
- no function-local import of a hutch module in the runtime (none dodges a cycle);
- `runtime/ports.py`, which every runtime layer depends on, imports no runtime module (not even under
  `TYPE_CHECKING`: a class it needs to name is a `Protocol` of its own);
- `mgmt/` reads what a node holds through the management agent port (`ManagementAgentPort`,
  runtime/ports.py; issue 26): it never imports the AMQP session, the queue types, clustering, the stream
  session, shovels, federation, the agent's or the gatherer's implementation or `app`; the modules in
  `MGMT_NOT_YET_ON_THE_PORT` are what is still to move, and that list may only shrink;
- no module graph has a cycle, every import counted as an edge (`TYPE_CHECKING` ones and function-local
  ones too): the runtime's, and that of each other package (issue 22: a type-only circle between
  `queues/quorum/state.py` and `deadletter.py` went unseen while only the runtime was checked).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PURE = ("amqp", "core", "queues", "raft", "storage", "cluster", "streamproto")

FORBIDDEN = {
    "hutch.runtime.session": ("hutch.runtime.broker.node", "hutch.runtime.clustering",
                              "hutch.runtime.queue_types", "hutch.runtime.app"),
    "hutch.runtime.broker": ("hutch.runtime.session", "hutch.runtime.queue_types",
                             "hutch.runtime.clustering", "hutch.runtime.app"),
    "hutch.runtime.clustering": ("hutch.runtime.broker", "hutch.runtime.queue_types",
                                 "hutch.runtime.session", "hutch.runtime.app"),
    "hutch.runtime.queue_types": ("hutch.runtime.session", "hutch.runtime.app", "hutch.runtime.stream_session"),
    # the stream protocol's session: the stream queue type only through its handle (the seam) and its
    # own port; of the AMQP session only the shapes in session/ports.py
    "hutch.runtime.stream_session": ("hutch.runtime.broker.node", "hutch.runtime.clustering",
                                     "hutch.runtime.session.connection", "hutch.runtime.session.channel",
                                     "hutch.runtime.session.protocol", "hutch.runtime.app"),
    # shovels and federation are AMQP clients: they reach the node through a session (the in-process pipe)
    # and the parameter store, never its queue types, clustering or the node class
    "hutch.runtime.shovel": ("hutch.runtime.broker.node", "hutch.runtime.queue_types", "hutch.runtime.clustering",
                             "hutch.runtime.federation", "hutch.runtime.app"),
    "hutch.runtime.federation": ("hutch.runtime.broker.node", "hutch.runtime.queue_types",
                                 "hutch.runtime.clustering", "hutch.runtime.app"),
    # the supervisor does no message work; a worker's control link knows the transport only as a callable
    "hutch.runtime.workers": ("hutch.runtime.broker", "hutch.runtime.session", "hutch.runtime.queue_types",
                              "hutch.runtime.clustering", "hutch.runtime.app"),
}


# mgmt/ asks the node's management agent (runtime/ports.py ManagementAgentPort) instead of these
MGMT_FORBIDDEN = ("hutch.runtime.session", "hutch.runtime.queue_types", "hutch.runtime.clustering",
                  "hutch.runtime.stream_session", "hutch.runtime.shovel", "hutch.runtime.federation",
                  "hutch.runtime.agent", "hutch.runtime.gather", "hutch.runtime.app")
# what mgmt/ still reads of them (docs/management.md, "The management agent"): only ever shrinks
MGMT_NOT_YET_ON_THE_PORT = {
    "hutch.mgmt.cluster": {"hutch.runtime.clustering.service"},
    "hutch.mgmt.quorum": {"hutch.runtime.clustering.raft_group", "hutch.runtime.clustering.service",
                          "hutch.runtime.clustering.transport", "hutch.runtime.queue_types.quorum.queue",
                          "hutch.runtime.queue_types.quorum.service"},
    "hutch.mgmt.stream_routes": {"hutch.runtime.stream_session", "hutch.runtime.stream_session.catalog",
                                 "hutch.runtime.stream_session.super_streams"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, whether the import is inside a function) for every import in the file."""
    return list(_imports(path))


@functools.cache  # each source file is parsed once per run, not once per rule that reads it
def _imports(path: Path) -> tuple[tuple[str, bool], ...]:
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((alias.name, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[:len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                found.append((mod, in_function))
                # `from package import module` imports the module too
                found.extend((f"{mod}.{alias.name}", in_function) for alias in child.names)
            visit(child, local)

    visit(tree, False)
    return tuple(found)


def all_files() -> list[Path]:
    return sorted((SRC / "hutch").rglob("*.py"))


MODULES = {module_name(p) for p in all_files()}


def resolve(name: str) -> str | None:
    """The hutch module an imported name refers to (a `from m import symbol` names m)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_pure_packages_never_import_the_shell():
    bad = []
    for path in all_files():
        me = module_name(path)
        if me.count(".") < 1 or me.split(".")[1] not in PURE:
            continue
        for name, _local in imports(path):
            if name.startswith(("hutch.runtime", "hutch.mgmt", "hutch.cli")):
                bad.append(f"{me} imports {name}")
    assert bad == []


def test_runtime_layers_import_only_downwards():
    bad = []
    for path in (SRC / "hutch" / "runtime").rglob("*.py"):
        me = module_name(path)
        for layer, forbidden in FORBIDDEN.items():
            if me == layer or me.startswith(layer + "."):
                for name, _local in imports(path):
                    if name.startswith(forbidden):
                        bad.append(f"{me} imports {name}")
    assert bad == []


def test_mgmt_reads_the_node_through_the_management_agent_port():
    found: dict[str, set[str]] = {}
    for path in (SRC / "hutch" / "mgmt").rglob("*.py"):
        reads = {target for name, _ in imports(path)
                 if (target := resolve(name)) and target.startswith(MGMT_FORBIDDEN)}
        if reads:
            found[module_name(path)] = reads
    assert not any(m.startswith("hutch.runtime.session") for reads in found.values() for m in reads)
    assert found == MGMT_NOT_YET_ON_THE_PORT


def test_only_the_server_cli_imports_the_composition_root():
    users = {module_name(p) for p in all_files()
             if any(resolve(name) == "hutch.runtime.app" for name, _ in imports(p))}
    assert users - {"hutch.runtime.app"} == {"hutch.cli.server"}


def test_no_function_local_hutch_imports_in_the_runtime():
    bad = [f"{module_name(p)} imports {name} inside a function"
           for p in (SRC / "hutch" / "runtime").rglob("*.py")
           for name, local in imports(p) if local and name.startswith("hutch")]
    assert bad == []


def test_the_ports_module_imports_no_runtime_module():
    bad = [name for name, _ in imports(SRC / "hutch" / "runtime" / "ports.py")
           if name.startswith("hutch.runtime")]
    assert bad == []


def module_cycles(package: str = "hutch.runtime") -> list[str]:
    """Import cycles among the modules of `package` (a package's `__init__` re-exports are not edges)."""
    graph: dict[str, set[str]] = {}
    for path in (SRC / package.replace(".", "/")).rglob("*.py"):
        me = module_name(path)
        graph[me] = {target for name, _ in imports(path)
                     if (target := resolve(name)) and target.startswith(package + ".") and target != me
                     and path.name != "__init__.py"}
    # a package's __init__ is not an edge target worth reporting
    cycles = []
    state: dict[str, int] = {}

    def dfs(node: str, stack: list[str]) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                dfs(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            dfs(node, [])
    return cycles


def runtime_cycles() -> list[str]:
    return module_cycles("hutch.runtime")


def test_the_runtime_has_no_import_cycle():
    assert runtime_cycles() == []


def test_no_package_has_an_import_cycle_type_only_imports_included():
    packages = sorted({module_name(p).split(".")[1] for p in all_files() if module_name(p).count(".") >= 1
                       and (SRC / "hutch" / module_name(p).split(".")[1]).is_dir()})
    assert "queues" in packages and "mgmt" in packages
    cycles = {package: found for package in packages if (found := module_cycles(f"hutch.{package}"))}
    assert cycles == {}


def test_the_cycle_check_sees_a_type_only_edge():
    """The scan counts an import under `if TYPE_CHECKING:` (what hid the quorum state/deadletter circle)."""
    probe = SRC / "hutch" / "queues" / "quorum" / "deadletter.py"
    found = [name for name, _ in imports(probe)]
    assert "hutch.queues.quorum.messages.LiveIndexes" in found  # imported only for type checking


def test_the_stream_protocol_codec_is_stdlib_only():
    bad = [f"{module_name(p)} imports {name}" for p in (SRC / "hutch" / "streamproto").rglob("*.py")
           for name, _ in imports(p)
           if name.startswith("hutch") and not name.startswith("hutch.streamproto")]
    assert bad == []
