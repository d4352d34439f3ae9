"""A dry run's stand-ins for the stages that need a GPU: each says what it would run and writes
a stand-in result, so the check's bookkeeping runs anywhere."""
import json
import os


def dry_junit(stage, failing):
    """A stand-in JUnit file: the stage's tests, all passed, or the first failed."""
    cases = "".join(
        f'<testcase classname="dry" name="{test}">'
        + ('<failure message="simulated"/>' if failing and i == 0 else "") + "</testcase>"
        for i, test in enumerate(stage.tests))
    return (f'<testsuites><testsuite tests="{len(stage.tests)}" failures="{int(failing)}" '
            f'errors="0" skipped="0">{cases}</testsuite></testsuites>')


def dry_stub(stage, work, python, failing=False):
    """What a stage runs in a dry run: it says what it would run and writes a stand-in result,
    so the bookkeeping (limits, summary, verdict, bundle) is exercised without a GPU. A
    `failing` stage exits 1 (its first test fails)."""
    stand_in = json.dumps({"dry_run": True})
    lines = [f"print('dry run: would run', {' '.join(stage.argv[:6])!r}, flush=True)"]
    if stage.result:
        lines.append(f"open({str(work / stage.result)!r}, 'w').write({stand_in!r})")
    if stage.junit:
        lines.append(f"open({str(work / stage.junit)!r}, 'w').write({dry_junit(stage, failing)!r})")
    if stage.marker:
        lines.append(f"print({stage.marker + stand_in!r})")
    seconds = float(os.environ.get("RINGCOMM_GPU_CHECK_DRY_SLEEP", "0"))
    lines.append(f"import time; time.sleep({seconds})")
    if failing:
        lines.append("raise SystemExit('dry run: simulated failure')")
    return [python, "-c", "\n".join(lines)]
