"""Builds ringcomm._C: always the CPU core; the CUDA part too when nvcc is found. And
ringcomm._testing, the entry points only the tests and benchmarks call, as a module of its own.

csrc/ has a folder per part: core (its interface in include/ringcomm), the CPU reducer (cpu),
the host transports (shm: shared memory, tcp), with CUDA the NCCL transport (nccl) and the
kernels, CUDA reducer and the backend that pairs it with the NCCL transport (cuda, which
includes nccl and not the reverse), and the bindings of each module (_C: python; _testing:
testing). The core's sources (every folder but the bindings'; cuda and nccl only with CUDA, as
they alone include CUDA's and NCCL's headers) and the binding code both modules call
(SHARED_BINDINGS) are compiled once and linked into both modules; each module adds its bindings
(_C: csrc/python; _testing: csrc/testing; with CUDA each one's cuda/ subfolder too).

Environment:
  RINGCOMM_CUDA=0|1         force the CUDA part off or on (default: on when nvcc is found)
  RINGCOMM_TESTING=0|1      build ringcomm._testing (default 1; the tests need it)
  RINGCOMM_CUDA_ARCHS       GPU targets, e.g. "80,90" or "sm_80;sm_90" (default 80,90 + PTX)
  RINGCOMM_NCCL_INCLUDE     folder holding nccl.h (default: the nvidia-nccl-cu13 wheel's)
  RINGCOMM_BUILD_JOBS       parallel compile jobs (default: all cores)
"""
import glob
import os
import re
import shutil
import site
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

ROOT = Path(__file__).parent.resolve()
CSRC = ROOT / "csrc"
BINDING_FOLDERS = ("python", "testing")
CUDA_FOLDERS = ("cuda", "nccl")  # the only folders whose files include CUDA or NCCL headers
# Binding code both modules call: the interrupt check each installs at import.
SHARED_BINDINGS = ["csrc/python/signal_check.cc"]


def find_cuda_home():
    """The toolkit folder: CUDA_HOME / CUDA_PATH, else (when nvcc is on PATH) the conventional
    install folder. The nvcc on PATH may be a wrapper script elsewhere, so its own folder is
    only a last guess, and must hold the CUDA headers."""
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if candidate and (Path(candidate) / "bin" / "nvcc").exists():
            return Path(candidate)
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None  # no toolkit in sight: the CPU-only build
    for candidate in (Path("/usr/local/cuda"), Path(nvcc).resolve().parent.parent):
        if (candidate / "bin" / "nvcc").exists() and (candidate / "include" / "cuda_runtime.h").exists():
            return candidate
    return None


def cuda_wanted(cuda_home):
    forced = os.environ.get("RINGCOMM_CUDA")
    if forced is not None:
        if forced == "1" and cuda_home is None:
            raise SystemExit("RINGCOMM_CUDA=1 but no CUDA toolkit (nvcc) was found; set CUDA_HOME")
        return forced == "1"
    return cuda_home is not None


def find_nccl_include():
    """nccl.h from RINGCOMM_NCCL_INCLUDE, the nvidia-nccl-cu13 wheel, or system folders.

    pip's isolated builds hide the target environment's packages from import, so the wheel is
    also looked for by path in the interpreter's site-packages folders."""
    candidates = [os.environ.get("RINGCOMM_NCCL_INCLUDE")]
    try:
        import nvidia.nccl

        candidates += [str(Path(p) / "include") for p in nvidia.nccl.__path__]
    except ImportError:
        pass
    folders = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    folders.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    candidates += [str(Path(f) / "nvidia" / "nccl" / "include") for f in sorted(folders)]
    candidates += ["/usr/include", "/usr/local/include"]
    for folder in candidates:
        if folder and (Path(folder) / "nccl.h").exists():
            return Path(folder)
    raise SystemExit(
        "Building ringcomm's CUDA part needs NCCL's headers: `pip install nvidia-nccl-cu13` "
        "(or set RINGCOMM_NCCL_INCLUDE), or build without CUDA: RINGCOMM_CUDA=0")


def nccl_header_version(include):
    text = (include / "nccl.h").read_text()
    parts = [re.search(rf"#define NCCL_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) for p in parts) if all(parts) else "unknown"


def cuda_archs():
    raw = os.environ.get("RINGCOMM_CUDA_ARCHS", "80,90")
    archs = [a.strip().lower().replace("sm_", "").replace(".", "") for a in re.split(r"[,; ]+", raw)]
    return [a for a in archs if a]


class BuildWithCuda(build_ext):
    """Compiles the core's sources and SHARED_BINDINGS once (csrc/cuda/*.cu with nvcc), then
    links those objects into every extension with its own sources."""

    def build_extensions(self):
        # setuptools rebuilds only when a source is newer than the module: a build with CUDA
        # switched on or off, other archs, a changed header or .cu must rebuild too.
        core = CORE
        config = repr(sorted(core.define_macros))
        stamp = Path(self.build_temp) / "ringcomm-build-config"
        if not stamp.exists() or stamp.read_text() != config:
            self.force = True
        objects = self.compile_core(core, core.sources + SHARED_BINDINGS)
        if core.cuda:
            objects += self.compile_cuda(core.cuda)
        for ext in self.extensions:
            on_host = getattr(ext, "kernels_on_host", False)
            extra = self.compile_kernels_on_host(ext) if on_host else []
            ext.extra_objects = objects + extra
            ext.depends = ext.depends + objects + extra
        super().build_extensions()
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(config)

    def stale(self, source, target):
        """Whether `target` (an object) must be rebuilt from `source` (any header counts)."""
        if self.force or not Path(target).exists():
            return True
        built = Path(target).stat().st_mtime
        return any(Path(p).stat().st_mtime > built for p in [source, *CORE.depends])

    def compile_core(self, core, sources):
        """C++ `sources` compiled with the core's flags, those out of date only."""
        out_dir = str(Path(self.build_temp) / "core")
        objects = self.compiler.object_filenames(sources, output_dir=out_dir)
        stale = [src for src, obj in zip(sources, objects) if self.stale(src, obj)]
        if stale:
            self.compiler.compile(stale, output_dir=out_dir, macros=core.define_macros,
                                  include_dirs=core.include_dirs,
                                  extra_postargs=core.extra_compile_args)
        return objects

    def compile_cuda(self, cuda):
        archs = cuda["archs"]
        flags = ["-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
                 "--expt-relaxed-constexpr", f"-I{CSRC / 'include'}", f"-I{CSRC}",
                 f"-I{cuda['nccl_include']}"]
        for arch in archs:
            flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
        flags += ["-gencode", f"arch=compute_{archs[-1]},code=compute_{archs[-1]}"]  # PTX
        out_dir = Path(self.build_temp) / "cuda"
        out_dir.mkdir(parents=True, exist_ok=True)
        sources = sorted(glob.glob(str(CSRC / "cuda" / "*.cu")))
        jobs = [(src, str(out_dir / (Path(src).stem + ".o"))) for src in sources]

        def run(job):
            src, obj = job
            if not self.stale(src, obj):
                return obj
            print(f"nvcc {Path(src).name}", flush=True)
            subprocess.check_call([str(cuda["nvcc"]), *flags, "-c", src, "-o", obj])
            return obj

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return list(pool.map(run, jobs))


    def compile_kernels_on_host(self, ext):
        """The kernels' sources compiled again by the host compiler, for the CPU tests: their
        grids run on the CPU (csrc/testing/cuda/kernels_on_host.h), under symbols of their own."""
        out_dir = Path(self.build_temp) / "kernels_on_host"
        out_dir.mkdir(parents=True, exist_ok=True)
        compiler = (getattr(self.compiler, "compiler_cxx", None) or self.compiler.compiler_so)[:1]
        flags = ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-Wno-unknown-pragmas",
                 "-x", "c++", "-include", "testing/cuda/kernels_on_host.h"]
        flags += [f"-I{folder}" for folder in ext.include_dirs]
        jobs = [(src, str(out_dir / (Path(src).name + ".o"))) for src in kernel_sources()]

        def run(job):
            src, obj = job
            if not self.stale(src, obj):
                return obj
            print(f"host build of {Path(src).name}", flush=True)
            subprocess.check_call([*compiler, *flags, "-c", src, "-o", obj])
            return obj

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return list(pool.map(run, jobs))


def kernel_sources():
    """The CUDA kernels and the reducer that launches them: what the CPU tests also build for
    the host (the inline namespace of csrc/cuda/kernel_build.h)."""
    return sorted(glob.glob(str(CSRC / "cuda" / "*.cu"))) + [str(CSRC / "cuda" / "cuda_reducer.cc")]


def cc_files(folder):
    return sorted(os.path.relpath(p, ROOT) for p in (CSRC / folder).glob("*.cc"))


def make_core():
    """The core: every source folder of csrc/ (core, cpu, shm, tcp, a new host transport's) but
    the bindings', and with CUDA the CUDA folders (cuda's .cu files too, compile_cuda). Not a
    module of its own: its objects are linked into each extension."""
    skipped = ("include", *BINDING_FOLDERS, *CUDA_FOLDERS)
    folders = sorted(p.name for p in CSRC.iterdir() if p.is_dir() and p.name not in skipped)
    sources = [s for folder in folders for s in cc_files(folder)]
    core = Pybind11Extension(
        "ringcomm._core",  # never built as a module: the flags and sources the objects share
        sources=sources,
        include_dirs=[str(CSRC / "include"), str(CSRC)],
        cxx_std=17,
        extra_compile_args=["-O3"],
        libraries=["rt", "pthread", "dl"],
        depends=sorted(str(p) for pattern in ("*.h", "*.cuh") for p in CSRC.rglob(pattern)),
    )
    core.cuda = None
    cuda_home = find_cuda_home()
    if cuda_wanted(cuda_home):
        nccl_include = find_nccl_include()
        archs = cuda_archs()
        core.sources += [s for folder in CUDA_FOLDERS for s in cc_files(folder)]
        core.include_dirs += [str(cuda_home / "include"), str(nccl_include)]
        core.library_dirs += [str(cuda_home / "lib64")]
        core.libraries = ["cudart_static"] + core.libraries  # no libcudart needed at run time
        core.define_macros += [
            ("RINGCOMM_WITH_CUDA", "1"),
            ("RINGCOMM_CUDA_ARCHS", '"' + ",".join(f"sm_{a}" for a in archs) + '"'),
            ("RINGCOMM_NCCL_HEADER_VERSION", '"' + nccl_header_version(nccl_include) + '"'),
            ("RINGCOMM_CUDA_INCLUDE", '"' + str(cuda_home / "include") + '"'),
        ]
        core.cuda = {"nvcc": cuda_home / "bin" / "nvcc", "archs": archs,
                     "nccl_include": nccl_include}
    return core


def make_module(name, sources, core):
    """An extension of `sources`, with the core's flags, linked with the core's objects."""
    return Pybind11Extension(
        name, sources=sources, include_dirs=list(core.include_dirs), cxx_std=17,
        extra_compile_args=["-O3"], libraries=list(core.libraries),
        library_dirs=list(core.library_dirs), define_macros=list(core.define_macros),
        depends=list(core.depends))


def make_extensions(core):
    # ringcomm._C: its bindings, csrc/python (with CUDA csrc/python/cuda too).
    bindings = [s for s in cc_files("python") if s not in SHARED_BINDINGS]
    modules = [make_module("ringcomm._C", bindings + (cc_files("python/cuda") if core.cuda else []),
                           core)]
    # ringcomm._testing: csrc/testing (and with CUDA its host implementation of CUDA and NCCL,
    # csrc/testing/cuda, and the kernels' host build).
    if os.environ.get("RINGCOMM_TESTING", "1") != "0":
        testing = make_module("ringcomm._testing", cc_files("testing") + (
            cc_files("testing/cuda") if core.cuda else []), core)
        testing.kernels_on_host = bool(core.cuda)
        modules.append(testing)
    return modules


ParallelCompile("RINGCOMM_BUILD_JOBS", default=0).install()
CORE = make_core()
setup(ext_modules=make_extensions(CORE), cmdclass={"build_ext": BuildWithCuda})
