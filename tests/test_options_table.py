"""The options table (ringcomm.options.OPTIONS) is the one place an option's default is written:
CommOptions, the environment, help(ringcomm.options) and every C++ constructor come from it, and
nothing in csrc/, ringcomm/, README or docs/ states a default again."""
import dataclasses
import os
import pathlib
import pydoc
import re

import pytest

import ringcomm
from ringcomm.transport import cuda as cuda_backend
from ringcomm.options import DEFAULTS, OPTIONS, THRESHOLDS, CommOptions, KiB, MiB, _size

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The C++ names of the options' struct fields (ShmOptions, WaitPolicy, CommunicatorOptions,
# CudaTransportOptions, the kernels' launches): none may have a default other than "unset".
CXX_FIELDS = ("slotBytes", "slotCount", "publishBytes", "sliceBytes", "slots", "timeoutSeconds",
              "spinMicros", "yieldMicros", "smsForNccl", "recordGraphs")


def _sources(*patterns):
    for pattern in patterns:
        yield from sorted(ROOT.glob(pattern))


def _cxx():
    return {p: p.read_text() for p in _sources("csrc/**/*.h", "csrc/**/*.cc", "csrc/**/*.cu",
                                                "csrc/**/*.cuh")}


def _spellings(value):
    """Regexes for the ways C++ or Python write `value` bytes: 262144, 256 * 1024, 256 << 10,
    4 << 20, 4 * 1024 * 1024, 4 * MiB."""
    forms = [rf"(?<![\w.]){value}(?![\w.])"]
    for shift, unit, product in ((10, "KiB", r"\*\s*1024"), (20, "MiB", r"\*\s*1024\s*\*\s*1024")):
        if value % (1 << shift) == 0:
            n = value >> shift
            forms += [rf"(?<![\w.]){n}\s*(?:{product}|<<\s*{shift}|\*\s*{unit})(?![\w.])"]
    return forms


def _written_defaults():
    """(option, value) for every number the table itself writes (the thresholds' are the
    algorithm table's, kAlgorithms in algorithms.h), large enough to be told apart in a grep."""
    for option in OPTIONS:
        if option.name in THRESHOLDS:
            continue
        for value in (option.default, option.crowded):
            if isinstance(value, int) and not isinstance(value, bool) and value >= 1000:
                yield option, value


def test_every_field_is_a_row_and_every_row_a_field():
    fields = [f.name for f in dataclasses.fields(CommOptions)]
    assert fields == [option.name for option in OPTIONS]
    assert set(THRESHOLDS) <= set(fields)
    assert {o.name: o.default for o in OPTIONS if o.name in THRESHOLDS} == \
        dict(ringcomm._C.DEFAULT_THRESHOLDS)


def test_the_resolved_defaults_are_the_table(monkeypatch):
    for option in OPTIONS:
        if option.environment:
            monkeypatch.delenv(option.environment, raising=False)
    resolved = CommOptions(timeout=7).resolved(world_size=1)  # a core per rank
    for option in OPTIONS:
        if option.default is not None:
            assert getattr(resolved, option.name) == option.default, option.name
    zero = CommOptions(timeout=7, publish_bytes=0, slot_count=0).resolved(world_size=1)
    assert zero.publish_bytes == DEFAULTS["publish_bytes"]  # a size of 0 is the default
    assert zero.slot_count == DEFAULTS["slot_count"]
    crowded = CommOptions(timeout=7).resolved(world_size=(os.cpu_count() or 1) + 1)
    for option in OPTIONS:
        if option.crowded is not None:
            assert getattr(crowded, option.name) == option.crowded, option.name


def _other_text(option):
    """Environment text that sets `option` to something other than its default."""
    if isinstance(option.default, bool):
        return "0" if option.default else "1"
    if option.name == "algorithm":
        return next(a for a in ringcomm.options.ALGORITHMS if a != option.default)
    if option.name in ("pin_cores", "uneven_leaders"):
        return "off"
    if isinstance(option.default, str):
        return "/nowhere/libnccl.so.2"
    return str((option.default or 0) + 3)


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.environment], ids=lambda o: o.name)
def test_every_variable_changes_its_resolved_value(option, monkeypatch):
    for other in OPTIONS:
        if other.environment:
            monkeypatch.delenv(other.environment, raising=False)
    text = _other_text(option)
    monkeypatch.setenv(option.environment, text)
    value = getattr(CommOptions(timeout=7).resolved(world_size=1), option.name)
    assert value == option.parse(text) and value != option.default, (option.name, value)
    explicit = CommOptions(timeout=7, **{option.name: option.default}).resolved(world_size=1)
    assert getattr(explicit, option.name) == option.default  # the argument wins


def test_every_option_has_a_variable_but_the_per_call_ones():
    # timeout comes from the process group or the argument; slice_bytes follows each device's
    # own option (slot_bytes, cuda_slice_bytes) unless given.
    assert [o.name for o in OPTIONS if not o.environment] == ["timeout", "slice_bytes"]
    variables = [o.environment for o in OPTIONS if o.environment]
    assert len(set(variables)) == len(variables)
    assert all(v.startswith("RINGCOMM_") for v in variables)


def test_help_lists_every_row():
    text = pydoc.plain(pydoc.render_doc(ringcomm.options))
    for option in OPTIONS:
        row = re.search(rf"^\s*\| {option.name} \| {option.environment or '-'} \| (.*) \| "
                        rf"(.*) \|$", text, re.M)
        assert row, option.name
        default, doc = row.groups()
        assert doc == option.doc
        if option.default is not None:
            assert default.startswith(ringcomm.options._shown(option, option.default))
        if option.crowded is not None:
            assert ringcomm.options._shown(option, option.crowded) in default
        if option.name.endswith("_bytes") and option.default and option.default % 1024 == 0:
            assert re.match(r"\d+ [KM]iB", default), (option.name, default)  # sizes in units


def test_no_cxx_default_of_an_option():
    """C++ structs and bindings take every option from the caller: no default member initializer
    but "unset" (0, false), no py::arg default for an option, no number of the table."""
    # The bindings' names for options. A request's `algorithm` is a call's (the ring unless
    # asked), not the option, which Python resolves per call; 0 and None mean "none" or "the
    # communicator's" (a wait's timeout), never an option's value.
    ring_names = cuda_backend.ring_arguments(CommOptions(timeout=7).resolved(1))
    binding_names = ({o.name for o in OPTIONS} | set(ring_names)) - {"algorithm"}
    found = []
    for path, text in _cxx().items():
        where = path.relative_to(ROOT)
        for name, value in re.findall(r'py::arg\("(\w+)"\)\s*=\s*([^,)]+\)?)', text):
            if name in binding_names and value.strip() not in ("0", "0.0", "py::none()"):
                found.append(f"{where}: py::arg(\"{name}\") = {value}")
        for name, value in re.findall(rf"\b({'|'.join(CXX_FIELDS)})\s*=\s*([^;,)]+?)\s*[;,)]",
                                      text):
            literal = re.fullmatch(r"[\d\s<*.+]+|true", value)
            if literal and value.strip() not in ("0", "0.0"):
                found.append(f"{where}: {name} = {value}")
        for option, value in _written_defaults():
            for form in _spellings(value):
                for match in re.finditer(form, text):
                    found.append(f"{where}: {match.group(0)} ({option.name}'s default)")
    assert not found, "\n".join(found)


def test_no_python_default_of_an_option_outside_the_table():
    found = []
    for path in _sources("ringcomm/*.py"):
        if path.name == "options.py":
            continue
        text = path.read_text()
        for option, value in _written_defaults():
            for form in _spellings(value):
                found += [f"{path.name}: {m.group(0)} ({option.name})"
                          for m in re.finditer(form, text)]
    assert not found, "\n".join(found)


def test_no_default_restated_in_readme_or_docs():
    """Prose names the option and points to the table: no "`slot_bytes` 64 KiB" or "the
    default, 4 MiB" (measurements may name sizes)."""
    found = []
    for path in _sources("README.md", "docs/*.md"):
        text = path.read_text()
        for option in OPTIONS:
            for value in (option.default, option.crowded):
                if not isinstance(value, int) or isinstance(value, bool) or value is None:
                    continue
                shown = re.escape(ringcomm.options._shown(option, value))
                for pattern in (rf"`{option.name}`[^.;:\n`]{{0,12}}(?<![\w.]){shown}(?!\w|\.\d)",
                                rf"`{option.environment}`[^.;:\n`]{{0,6}}(?<![\w.]){shown}"
                                rf"(?!\w|\.\d)" if option.environment else None):
                    if pattern:
                        found += [f"{path.name}: {m.group(0)!r}"
                                  for m in re.finditer(pattern, text)]
            if isinstance(option.default, bool):  # "`debug` (off by default)"
                found += [f"{path.name}: {m.group(0)!r}" for m in re.finditer(
                    rf"`{option.name}`[^.;\n`]{{0,20}}\b(?:on|off) by default", text)]
        found += [f"{path.name}: {m.group(0)!r}" for m in re.finditer(
            r"\b(?:the default(?: is|,)?|defaults to) \d+ ?(?:[KMG]iB|B|us|ms)\b", text)]
    assert not found, "\n".join(found)
    readme = (ROOT / "README.md").read_text()
    assert "help(ringcomm.options)" in readme


def test_the_shared_gpu_ctas_follow_nccl_sms():
    assert cuda_backend.SHARED_GPU_DEFAULTS["NCCL_MAX_CTAS"] == str(DEFAULTS["nccl_sms"])


def test_sizes_take_binary_units_and_a_bad_value_names_its_variable(monkeypatch):
    for text, expected in (("32K", 32 * KiB), ("4MiB", 4 * MiB), ("1g", 1 << 30), ("65536", 65536),
                           ("0", None)):
        assert _size(text) == expected, text
    monkeypatch.setenv("RINGCOMM_SHM_SLOT_BYTES", "32 kB")
    assert CommOptions(timeout=7).resolved(world_size=1).slot_bytes == 32 * KiB
    monkeypatch.setenv("RINGCOMM_SHM_SLOT_BYTES", "lots")
    with pytest.raises(ValueError, match=r"RINGCOMM_SHM_SLOT_BYTES='lots': 'lots' is not a size"):
        CommOptions(timeout=7).resolved(world_size=1)


@pytest.mark.parametrize("name,bad", [("pin_cores", "sometimes"), ("uneven_leaders", "1")])
def test_a_word_option_refuses_other_words(name, bad):
    with pytest.raises(ValueError, match=f"{name}='{bad}'"):
        CommOptions(timeout=7, **{name: bad}).resolved(world_size=1)
