"""The package's dependencies point one way (README, "Architecture") and no module imports itself back."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "edge_slm_node"
# layer -> layers it may import (besides itself)
ALLOWED = {
    "kernels": set(),
    "kv": set(),
    "model": {"kernels"},
    "engine": {"model", "kv", "kernels"},
    "cli": {"engine", "model", "kv", "kernels"},
    "ros": {"engine", "model", "kv", "kernels"},
}
ROS_ONLY = ("rclpy", "rcl_interfaces", "diagnostic_msgs", "edge_slm_node.msg", "edge_slm_node.srv",
            "edge_slm_node.action", "launch")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set:
    """Absolute names of the modules `path` imports (relative imports resolved)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return names


def graph() -> dict:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def test_layers_import_only_downwards():
    wrong = []
    for name, path in sorted((module_name(p), p) for p in PACKAGE.rglob("*.py")):
        layer = name.split(".")[1] if name.count(".") else None
        if layer not in ALLOWED:
            continue
        for target in imports_of(path):
            if target.startswith("edge_slm_node.") and not target.startswith(ROS_ONLY):
                other = target.split(".")[1]
                if other != layer and other in ALLOWED and other not in ALLOWED[layer]:
                    wrong.append(f"{name} imports {target}")
            if layer != "ros" and target.startswith(ROS_ONLY):
                wrong.append(f"{name} imports {target} (ROS belongs in ros/)")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    edges = graph()
    cycles = []

    def visit(name, stack, on_stack, done):
        on_stack.add(name)
        stack.append(name)
        for target in sorted(edges[name]):
            if target in on_stack:
                cycles.append(" -> ".join(stack[stack.index(target):] + [target]))
            elif target not in done:
                visit(target, stack, on_stack, done)
        stack.pop()
        on_stack.discard(name)
        done.add(name)

    done = set()
    for name in sorted(edges):
        if name not in done:
            visit(name, [], set(), done)
    assert not cycles, "\n".join(cycles)
