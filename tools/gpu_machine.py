"""The GPU machine the check is planned for, as data (MACHINE); what a machine has, found by the
env and info stages (before and after the build); and whether what the check runs fits MACHINE:
a build that fetches nothing where it has no package registry, and every module the stages
import on it.

Only the standard library at the top: the check starts where torch may be missing.
"""
import modulefinder
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The machine: its GPU, how long the whole check may take there and what it may leave behind,
# its Python, packages and tools. A real run records where the machine it ran on differs.
MACHINE = {
    "gpu": "NVIDIA H100",  # how torch names it, to the model
    "cuda_arch": "90",
    "check_minutes": 6,
    "output_files_max": 8,
    "output_file_bytes_max": 16 << 20,
    "python": "3.12",
    "torch": "2.11.0+cu130",
    "nccl": "2.28.9",  # what that torch pins (nvidia-nccl-cu13)
    "tools": ["nvcc", "compute-sanitizer"],
    "package_registry": False,
    # Top-level modules importable there: torch, cupy-cuda13x, nvidia-nccl-cu13, pybind11,
    # pytest and what they bring (torch needs setuptools from Python 3.12 on; cupy numpy).
    "modules": ["torch", "filelock", "typing_extensions", "sympy", "mpmath", "networkx",
                "jinja2", "markupsafe", "fsspec", "setuptools", "pkg_resources",
                "_distutils_hack", "triton", "nvidia", "cupy", "cupyx", "cupy_backends",
                "numpy", "fastrlock", "pybind11", "pytest", "_pytest", "pluggy", "iniconfig",
                "packaging", "pygments"],
}

# Gone from the standard library in 3.12, though older Pythons have them.
REMOVED_IN_312 = {"distutils", "imp", "asynchat", "asyncore", "smtpd"}
MODULE_OF = {"nvidia-nccl-cu13": "nvidia", "cupy-cuda13x": "cupy",
             "pytest-timeout": "pytest_timeout"}  # distributions whose module is named otherwise


def fits(stages, machine, root=ROOT):
    """Every way the stages do not fit `machine`, as sentences."""
    return (build(stages, machine, root) + imports(stages, machine, root)
            + [f"{s.name}: needs {s.tool}, which the machine lacks" for s in stages
               if s.tool and s.tool not in machine["tools"]])


def build(stages, machine, root):
    """The build fetches nothing (in place, or pip without build isolation or dependencies) where
    the machine has no package registry; what pyproject.toml asks for is on the machine."""
    found = []
    for stage in (s for s in stages if s.name == "build"):
        argv = " ".join(stage.argv)
        in_place = all(word in argv for word in ("setup.py", "build_ext", "--inplace"))
        offline = all(word in argv for word in ("pip install", "--no-build-isolation", "--no-deps"))
        if not (in_place or offline or machine["package_registry"]):
            found.append(f"build: `{argv}` would fetch packages; the machine has no registry "
                         "(build in place, or pip install --no-build-isolation --no-deps .)")
    try:
        import tomllib
        from packaging.requirements import Requirement
        from packaging.specifiers import SpecifierSet
    except ImportError:  # Python < 3.11, or no packaging: the build command alone is checked
        return found
    project = tomllib.loads((root / "pyproject.toml").read_text())
    python = project["project"].get("requires-python", "")
    if machine["python"] not in SpecifierSet(python):
        found.append(f"pyproject: requires-python {python} excludes Python {machine['python']}")
    for where, requirements in (("build-system.requires", project["build-system"]["requires"]),
                                ("dependencies", project["project"]["dependencies"])):
        for requirement in map(Requirement, requirements):  # markers taken as true: Linux
            name = requirement.name.lower()
            module = MODULE_OF.get(name, name.replace("-", "_"))
            if module not in machine["modules"]:
                found.append(f"pyproject {where}: {requirement} is not on the machine")
            elif module == "torch" and not requirement.specifier.contains(machine["torch"]):
                found.append(f"pyproject {where}: {requirement} excludes torch {machine['torch']}")
    return found


BUILT_MODULES = {"_C", "_testing"}  # ringcomm's compiled modules: the build stage makes them


def imports(stages, machine, root):
    """Every module the Python a stage runs imports, through the repo's own modules, is in the
    machine's standard library, the repo, or the machine's packages. Imports inside
    try/except ImportError count too."""
    available = (set(sys.stdlib_module_names) - REMOVED_IN_312) | set(machine["modules"])
    found = set()
    for stage in stages:
        scripts = [a.split("::")[0] for a in stage.argv if a.endswith(".py") or "::" in a]
        if "pytest" in stage.argv:
            scripts += sorted({str(Path(s).parent / "conftest.py") for s in scripts})
        scripts = [root / s for s in dict.fromkeys(scripts) if (root / s).exists()]
        # The stages' sys.path: the script's folder, the repo, tests/ and bench/.
        folders = [str(s.parent) for s in scripts] + [
            str(root / d) for d in ("", "tests", "tests/support", "bench")]
        for script in scripts:
            finder = modulefinder.ModuleFinder(path=list(dict.fromkeys(folders)))
            finder.run_script(str(script))
            for name, importers in finder.badmodules.items():
                top = name.split(".")[0]
                # A repo module's missing parts are the build's (ringcomm._C) or names imported
                # from it; `from ._C import x` shows as a bare "_C".
                if top in available or top in finder.modules or name in BUILT_MODULES:
                    continue
                why = " (removed in Python 3.12)" if top in REMOVED_IN_312 else ""
                for importer in importers:
                    where = Path(getattr(finder.modules.get(importer), "__file__", None) or script)
                    if where.resolve().is_relative_to(root.resolve()):
                        where = where.resolve().relative_to(root.resolve())
                    found.add(f"{where} imports {top}{why}, which the machine lacks")
    return sorted(found)


def differences(machine, found, tools):
    """Where the machine the check ran on differs from the one it is planned for, from what the
    env and info stages `found`; `tools`: the CUDA tools the check found (name -> path or None)."""
    nccl = found.get("nccl_runtime_version")
    have = {"gpu": found.get("gpu"), "python": found.get("python_version"),
            "torch": found.get("torch"),
            "nccl": nccl and f"{nccl // 10000}.{nccl // 100 % 100}.{nccl % 100}"}
    return ([f"{key} {value}, planned for {machine[key]}" for key, value in have.items()
             if value and not value.startswith(machine[key])]
            + [f"{name} not found" for name, path in tools.items() if path is None]
            + ([] if found.get("which", {}).get("nvcc") else ["nvcc not on PATH"]))


def env_probe():
    """What the machine has, before the build: interpreters, CUDA, the GPU, packages."""
    import platform
    info = {"python": sys.executable, "python_version": platform.python_version(),
            "which": {c: shutil.which(c) for c in ("python", "python3", "nvcc",
                                                   "compute-sanitizer")},
            "cuda_home": os.environ.get("CUDA_HOME")}

    def output(*argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=15).stdout.strip()
        except (OSError, subprocess.SubprocessError) as error:
            return f"unavailable: {error}"

    info["nvidia_smi"] = output("nvidia-smi", "--format=csv,noheader",
                                "--query-gpu=name,memory.total,driver_version,compute_cap")
    info["nvcc"] = output("nvcc", "--version").splitlines()[-1:] if shutil.which("nvcc") else None
    for module in ("torch", "pybind11", "setuptools", "pytest", "pytest_timeout", "cupy", "numpy"):
        try:
            info[module] = getattr(__import__(module), "__version__", "present")
        except Exception:  # a broken package is as good as none here
            info[module] = None
    try:
        import torch
        info["torch_cuda"] = torch.version.cuda
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        info["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if info["gpu"] else None
    except Exception as error:
        info["torch_error"] = repr(error)
    return info


def info_probe():
    """What the built ringcomm sees: its build, CUDA devices and the NCCL it loads."""
    sys.path.insert(0, str(ROOT))  # the ringcomm built in place
    import ringcomm
    from ringcomm import _C
    from ringcomm.transport import cuda
    info = dict(ringcomm.build_info(), cuda_available=_C.cuda_available(),
                devices=_C.device_count())
    info["nccl_library"], info["nccl_runtime_version"] = _C.nccl_library(**cuda.nccl_search())
    # How two ranks share the GPU with that NCCL: the variables each rank gets.
    shared = cuda.shared_gpu_env(0, 2, info["nccl_runtime_version"])
    info["multi_rank_path"] = " ".join(f"{name}={value}" for name, value in shared.items())
    return info
