"""Does the GPU check's plan fit? Its arithmetic (every limit holds its launches and tests, the
mandatory stages fit the budget) and the GPU machine it is written for (MACHINE: its Python,
packages and tools, and no package registry to fetch anything else). The dry run fails on any
problem found here; a real run records them and what its environment stage found different.

Only the standard library: it runs where torch may be missing.
"""
import ast
import re
import sys
from pathlib import Path

import gpu_check_plan as plan_rules

ROOT = Path(__file__).resolve().parent.parent

# The GPU machine the plan is written for, as far as it is known (a real run's env stage reports
# the machine it runs on).
MACHINE = {
    "python": "3.12",
    "torch": "2.11.0+cu130",
    "nccl": "2.28.9",  # what torch 2.11+cu130 pins (nvidia-nccl-cu13), by a public pin list
    "tools": ["nvcc", "compute-sanitizer"],
    "registry": False,
    # Top-level modules importable there: torch, cupy-cuda13x, nvidia-nccl-cu13, pybind11 and
    # pytest, and what those bring (torch needs setuptools from Python 3.12 on; cupy numpy).
    "modules": ["torch", "filelock", "typing_extensions", "sympy", "mpmath", "networkx",
                "jinja2", "markupsafe", "fsspec", "setuptools", "pkg_resources",
                "_distutils_hack", "triton", "nvidia", "cupy", "cupyx", "cupy_backends",
                "numpy", "fastrlock", "pybind11", "pytest", "_pytest", "pluggy", "iniconfig",
                "packaging", "pygments"],
}
# Gone from the standard library in 3.12 (the machine's Python), though older ones have them.
REMOVED_IN_312 = {"distutils", "imp", "asynchat", "asyncore", "smtpd"}
# Modules the build stage makes, not found as source.
BUILT = {"ringcomm._C"}
# Distribution names whose module is named otherwise.
MODULE_OF = {"nvidia-nccl-cu13": "nvidia", "cupy-cuda13x": "cupy",
             "pytest-timeout": "pytest_timeout"}


def problems(stages, machine=None, root=ROOT):
    """Every way the plan does not fit, as sentences (empty: it fits)."""
    machine = machine or MACHINE
    return (arithmetic(stages) + build(stages, machine, root) + imports(stages, machine, root)
            + tools(stages, machine) + planned_tests_match(stages, root))


def arithmetic(stages):
    found = []
    for stage in stages:
        if stage.work_s is not None:
            need = stage.launches * plan_rules.LAUNCH_S + stage.work_s
            if stage.limit + 1e-9 < need:
                found.append(f"{stage.name}: limit {stage.limit} s < {stage.launches} launches x "
                             f"{plan_rules.LAUNCH_S} s + {stage.work_s} s of work")
        budget = stage.env.get("RINGCOMM_TEST_LAUNCH_TIMEOUT")
        if budget and float(budget) > stage.limit - plan_rules.PYTEST_S - plan_rules.REPORT_S:
            found.append(f"{stage.name}: its launch's {budget} s leave pytest no time to start "
                         f"and report within {stage.limit} s")
    mandatory = sum(s.limit for s in stages if not s.optional)
    if mandatory > plan_rules.BUDGET:
        found.append(f"mandatory stages need {mandatory} s, over the budget of "
                     f"{plan_rules.BUDGET} s")
    return found


def _requirement(text):
    """(module, version spec) of a requirement such as "torch>=2.4; platform_system == 'Linux'"
    (markers are taken as true: the machine is Linux)."""
    name, spec = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*([^;]*)", text).groups()
    return MODULE_OF.get(name.lower(), name.lower().replace("-", "_")), spec.strip()


def _version(text):
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def _admits(spec, version):
    """Whether a spec of >=, >, <=, <, == clauses admits `version` (a string)."""
    have = _version(version)
    for op, want in re.findall(r"(>=|<=|==|>|<)\s*([0-9][0-9.]*)", spec):
        want = _version(want)
        n = len(want)
        ok = {">=": have >= want, "<=": have[:n] <= want, "==": have[:n] == want,
              ">": have > want, "<": have < want}[op]
        if not ok:
            return False
    return True


def build(stages, machine, root):
    """The build runs offline: in place (setup.py build_ext --inplace) or pip without build
    isolation or dependencies; what pyproject.toml asks for is on the machine."""
    found = []
    for stage in stages:
        if stage.name != "build":
            continue
        argv = " ".join(stage.argv)
        in_place = "setup.py" in argv and "build_ext" in argv and "--inplace" in argv
        offline_pip = ("pip install" in argv and "--no-build-isolation" in argv
                       and "--no-deps" in argv)
        if not (in_place or offline_pip or machine["registry"]):
            found.append(f"build: `{argv}` would fetch packages; the machine has no registry "
                         "(build in place, or pip install --no-build-isolation --no-deps .)")
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the stage commands are checked, not pyproject
        return found
    project = tomllib.loads((root / "pyproject.toml").read_text())
    python = project["project"].get("requires-python", "")
    if not _admits(python, machine["python"]):
        found.append(f"pyproject: requires-python {python} excludes Python {machine['python']}")
    for where, requirements in (("build-system.requires", project["build-system"]["requires"]),
                                ("dependencies", project["project"]["dependencies"])):
        for text in requirements:
            module, spec = _requirement(text)
            if module not in machine["modules"]:
                found.append(f"pyproject {where}: {text.strip()} is not on the machine")
            elif module == "torch" and not _admits(spec, machine["torch"]):
                found.append(f"pyproject {where}: {text.strip()} excludes torch {machine['torch']}")
    return found


def tools(stages, machine):
    return [f"{s.name}: needs {s.tool}, which the machine lacks" for s in stages
            if s.tool and s.tool not in machine["tools"]]


def _shared_worlds(root):
    """{test function: how tests/test_gpu.py runs it}: None in pytest's own process, else the
    world its shares_launch mark names: a number, "first" (WORLDS[0]) or "param" (its `world`
    parameter, from RINGCOMM_TEST_WORLDS)."""
    tree = ast.parse((root / plan_rules.GPU_TESTS).read_text())
    found = {}
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        found[node.name] = None
        for decorator in node.decorator_list:
            call = isinstance(decorator, ast.Call)
            if call and getattr(decorator.func, "id", "") == "shares_launch":
                world = next((k.value for k in decorator.keywords if k.arg == "world"), None)
                found[node.name] = (world.value if isinstance(world, ast.Constant) else
                                    "param" if world is None else "first")
    return found


def planned_tests_match(stages, root):
    """Every planned node id names a test tests/test_gpu.py defines, and the plan counts it as
    that file runs it: in pytest's process, or as a check in a launch of so many ranks (the
    launches, hence the limits, follow from it)."""
    defined = _shared_worlds(root)
    planned = {**{name: tests for name, tests in plan_rules.TESTS.items()},
               "sanitizer": plan_rules.SANITIZED}
    found = []
    for stage in stages:
        worlds = [int(w) for w in stage.env.get("RINGCOMM_TEST_WORLDS", "2").split(",")]
        for test in planned.get(stage.name, []) if stage.tests else []:
            name = test.name.split("[")[0]
            if name not in defined:
                found.append(f"{stage.name}: {test.name} is not a test of {plan_rules.GPU_TESTS}")
                continue
            how = defined[name]
            ranks = {None: 0, "first": worlds[0], "param": worlds[0]}.get(how, how)
            if how == "param" and len(worlds) > 1:
                ranks = "several"
            if ranks != test.ranks:
                found.append(f"{stage.name}: the plan runs {name} on {test.ranks or 'no'} ranks, "
                             f"{plan_rules.GPU_TESTS} on {ranks or 'none (in pytest)'}")
    return found


# -- what the stages import ----------------------------------------------------------------------

def stage_sources(stage, root):
    """(label, source text, path or None) of the Python a stage runs: a -c script, a script file,
    or pytest's test files and the conftest beside them."""
    argv = stage.argv
    sources = []
    if "-c" in argv:
        sources.append((f"{stage.name} -c", argv[argv.index("-c") + 1], None))
    if "pytest" in argv:
        files = {a.split("::")[0] for a in argv if a.endswith(".py") or "::" in a}
        files |= {str(Path(f).parent / "conftest.py") for f in files}
        for name in sorted(files):
            if (root / name).exists():
                sources.append((name, (root / name).read_text(), root / name))
    else:
        for arg in argv:
            if arg.endswith(".py") and (root / arg).exists():
                sources.append((arg, (root / arg).read_text(), root / arg))
    return sources


def _guarded(node, parents):
    """An import inside `try: ... except ImportError` (or a broader handler) is optional."""
    for parent in parents:
        if isinstance(parent, ast.Try) and node in _walk_body(parent.body):
            for handler in parent.handlers:
                names = ([handler.type] if not isinstance(handler.type, ast.Tuple)
                         else handler.type.elts) if handler.type else [None]
                for name in names:
                    if name is None or getattr(name, "id", None) in (
                            "ImportError", "ModuleNotFoundError", "Exception", "BaseException"):
                        return True
    return False


def _walk_body(body):
    for statement in body:
        yield from ast.walk(statement)


def _imports(source):
    """(module, level, names, guarded) of every import statement in `source`."""
    tree = ast.parse(source)
    parents = {}
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        chain, up = [], parents.get(node)
        while up is not None:
            chain.append(up)
            up = parents.get(up)
        guarded = _guarded(node, chain)
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, 0, [], guarded
        else:
            yield node.module or "", node.level, [a.name for a in node.names], guarded


def _resolve(module, near, root):
    """The repo file a module name is, searched as the stages' sys.path has it (the script's own
    folder, the repo root, tests/, bench/); None if it is not repo source."""
    parts = module.split(".")
    for folder in (near, root, root / "tests", root / "bench"):
        if folder is None:
            continue
        base = folder.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.exists():
                return candidate
    return None


def imports(stages, machine, root):
    """Every module a stage's Python imports, through the repo's own modules, is in the standard
    library of the machine's Python, the repo, what the build makes, or the machine's packages."""
    stdlib = set(sys.stdlib_module_names) - REMOVED_IN_312
    available = stdlib | set(machine["modules"])
    found, seen = [], set()

    def scan(label, source, path):
        near = path.parent if path else None
        for module, level, names, guarded in _imports(source):
            if level:  # relative: inside the package `path` belongs to
                package = path.parent
                for _ in range(level - 1):
                    package = package.parent
                targets = [package.joinpath(*(module.split(".") if module else []))]
                for target in [t / n for t in targets for n in names] + targets:
                    for candidate in (target.with_suffix(".py"), target / "__init__.py"):
                        if candidate.exists():
                            visit(candidate)
                continue
            candidates = [f"{module}.{n}" for n in names] + [module]
            files = [_resolve(m, near, root) for m in candidates]
            for file in filter(None, files):
                visit(file)
            if any(files) or any(m in BUILT for m in candidates):
                continue
            top = module.split(".")[0]
            if top not in available and not guarded:
                why = " (removed in Python 3.12)" if top in REMOVED_IN_312 else ""
                found.append(f"{label} imports {module}{why}, which the machine lacks")

    def visit(file):
        if file in seen:
            return
        seen.add(file)
        inside = file.resolve().is_relative_to(root.resolve())
        scan(str(file.resolve().relative_to(root.resolve()) if inside else file), file.read_text(),
             file)

    for stage in stages:
        for label, source, path in stage_sources(stage, root):
            if path is None:
                scan(label, source, None)
            else:
                visit(path)
    return sorted(set(found))


def differences(machine, env_found, tools):
    """What the environment stage found unlike the machine this plan assumes (the real run
    records them: the costs and paths above were chosen for that machine). `tools`: the CUDA
    tools the check found (name -> path or None)."""
    found = []
    python = env_found.get("python_version")
    if python and not python.startswith(machine["python"]):
        found.append(f"python {python}, planned for {machine['python']}")
    if env_found.get("torch") and env_found["torch"] != machine["torch"]:
        found.append(f"torch {env_found['torch']}, planned for {machine['torch']}")
    nccl = env_found.get("nccl_loaded_version")
    if nccl:
        dotted = f"{nccl // 10000}.{nccl // 100 % 100}.{nccl % 100}"
        if dotted != machine["nccl"]:
            found.append(f"NCCL {dotted}, planned for {machine['nccl']}")
    found += [f"{name} not found" for name, path in tools.items() if path is None]
    if not env_found.get("which", {}).get("nvcc"):
        found.append("nvcc not on PATH")
    return found
