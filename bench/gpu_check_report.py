"""What the GPU check leaves in $OUT besides check.log: summary.json (what every stage ran,
passed, failed and skipped, and the verdict) and bundle.tar.gz (every work file: JUnit XML,
launches.jsonl, NCCL debug logs, per-stage JSON), each replaced atomically so a run cut short
still reports; and the counts read from a stage's JUnit XML."""
import json
import tarfile
import xml.etree.ElementTree as ET

MAX_DEBUG_BYTES = 2 << 20  # per NCCL debug file in the bundle, at first (see write)
MAX_BUNDLE_BYTES = 15 << 20
OUTPUT_FILES = ("summary.json", "check.log", "bundle.tar.gz")


def junit_counts(path):
    """{tests, failures, errors, skipped, failed: [names]} from a JUnit XML file."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as error:
        return {"unreadable": str(error)}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {k: sum(int(s.get(k, 0)) for s in suites)
              for k in ("tests", "failures", "errors", "skipped")}
    counts["failed"] = [f"{case.get('classname')}::{case.get('name')}"
                        for case in root.iter("testcase")
                        if case.find("failure") is not None or case.find("error") is not None]
    # Skipped because their shared launch ran out of time (tests/shared_launch.py says "cut
    # short"): the stage was cut short, not passed.
    counts["cut_short"] = [f"{case.get('classname')}::{case.get('name')}"
                           for case in root.iter("testcase")
                           for skip in case.findall("skipped")
                           if "cut short:" in (skip.get("message") or "")]
    return counts


def write(out, work, summary):
    """summary.json and bundle.tar.gz into `out`, each replaced atomically: a kill leaves the
    last one."""
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1))
    tmp.replace(out / "summary.json")
    tmp = out / "bundle.tar.gz.tmp"
    cap = MAX_DEBUG_BYTES
    while True:  # over MAX_BUNDLE_BYTES: the NCCL logs are cut shorter
        bundle(work, tmp, cap)
        if tmp.stat().st_size <= MAX_BUNDLE_BYTES or cap < 1024:
            break
        cap //= 4
    tmp.replace(out / "bundle.tar.gz")


def bundle(work, path, cap):
    """Every file of `work` into a tar.gz; a file over `cap` bytes (a huge NCCL log) only its
    head: that says what matters."""
    with tarfile.open(path, "w:gz") as tar:
        for file in sorted(work.iterdir()):
            if file.is_file() and file.stat().st_size <= cap:
                tar.add(file, arcname=file.name)
            elif file.is_file():
                cut = work / (file.name + ".head")  # listed already: not re-added
                with open(file, "rb") as src:
                    cut.write_bytes(src.read(cap))
                tar.add(cut, arcname=file.name + ".head")
                cut.unlink()
