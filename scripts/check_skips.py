#!/usr/bin/env python3
"""Lists the tests that ctest skipped, with why, from its JUnit report (ctest --output-junit).

    scripts/check_skips.py JUNIT.xml [--build-dir build] [--allowlist tests/skip_allowlist.txt]

A skipped test is a check that cannot fail, so scripts/test.sh prints every skip after each run.
ctest reports a test as skipped when GoogleTest printed "[  SKIPPED ]" (gtest_discover_tests sets
that SKIP_REGULAR_EXPRESSION) or when a test exits with its SKIP_RETURN_CODE; the reason shown is
GoogleTest's skip message, or else the test's last line of output that mentions a skip.

With CI=true in the environment (or --ci), a skipped test that is not labelled `gpu` (the labels
come from `ctest --show-only=json-v1` in --build-dir) fails the run unless its name matches an
entry of the allow list: one entry a line, a ctest test name, a glob (fnmatch) or a regular
expression matching the whole name, followed by `# why`.

The last line is a plain count, "ctest: N passed, N failed, N skipped". Exit status: 0, 1 when CI
forbids a skip, 2 when the report or the allow list cannot be read. Only the standard library.
"""
import argparse
import collections
import fnmatch
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

GTEST_SKIPPED = re.compile(r"^\[  SKIPPED \] ")
GTEST_SKIP_LOCATION = re.compile(r"^.*:\d+: Skipped$")


def read_allowlist(path):
    """[(pattern, why)] from the allow list; every entry needs its `# why`."""
    entries = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            pattern, _, why = line.partition("#")
            pattern, why = pattern.strip(), why.strip()
            if not pattern:
                continue
            if not why:
                raise ValueError(f"{path}:{number}: entry {pattern!r} has no '# why' comment")
            entries.append((pattern, why))
    return entries


def allowed_by(name, entries):
    for pattern, why in entries:
        if fnmatch.fnmatchcase(name, pattern):
            return pattern, why
        try:
            if re.fullmatch(pattern, name):
                return pattern, why
        except re.error:
            pass
    return None


def gpu_tests(build_dir):
    """Names of the tests labelled gpu, or None when ctest cannot list them."""
    try:
        listing = subprocess.run(
            ["ctest", "--test-dir", build_dir, "--show-only=json-v1"],
            check=True, capture_output=True, text=True).stdout
        tests = json.loads(listing)["tests"]
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError) as e:
        print(f"skips: could not read the test labels from {build_dir}: {e}", file=sys.stderr)
        return None
    names = set()
    for test in tests:
        for prop in test.get("properties", []):
            if prop.get("name") == "LABELS" and "gpu" in prop.get("value", []):
                names.add(test["name"])
    return names


def skip_reason(testcase):
    """GoogleTest's skip message, else the output's last line about a skip, else ctest's word."""
    skipped = testcase.find("skipped")
    ctest_word = skipped.get("message", "") if skipped is not None else testcase.get("status", "")
    out_node = testcase.find("system-out")
    lines = (out_node.text or "").splitlines() if out_node is not None else []
    for i, line in enumerate(lines):
        if GTEST_SKIPPED.match(line):  # the first one ends the test's own output
            start = i
            while start > 0 and not GTEST_SKIP_LOCATION.match(lines[start - 1]):
                start -= 1
            if start > 0:
                message = " / ".join(l.strip() for l in lines[start:i] if l.strip())
                return message or "(GTEST_SKIP without a message)"
            break
    about_skip = [l.strip() for l in lines if "skip" in l.lower() and not GTEST_SKIPPED.match(l)]
    if about_skip:
        return about_skip[-1]
    last = [l.strip() for l in lines if l.strip()]
    return f"{ctest_word}: {last[-1]}" if last else (ctest_word or "no reason given")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("junit", help="ctest's --output-junit file")
    parser.add_argument("--build-dir", help="the ctest build directory, for the gpu labels")
    parser.add_argument("--allowlist", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "skip_allowlist.txt"))
    parser.add_argument("--ci", action="store_true", default=os.environ.get("CI") == "true",
                        help="fail on skips that are not allowed (default: CI=true in the env)")
    args = parser.parse_args()

    try:
        cases = ET.parse(args.junit).getroot().iter("testcase")
        entries = read_allowlist(args.allowlist) if args.ci else []
    except (OSError, ET.ParseError, ValueError) as e:
        print(f"skips: {e}", file=sys.stderr)
        return 2
    counts = collections.Counter()
    skips = []  # (name, reason)
    for case in cases:
        status = case.get("status", "")
        if status == "run":
            counts["passed"] += 1
        elif status == "fail" or case.find("failure") is not None:
            counts["failed"] += 1
        else:  # notrun (a skip), disabled
            counts["skipped"] += 1
            skips.append((case.get("name", "?"), skip_reason(case)))

    gpu = gpu_tests(args.build_dir) if args.build_dir and skips else set()
    gpu_skips = collections.defaultdict(list)  # reason -> names
    forbidden = []
    print(f"skips: {len(skips)} of {sum(counts.values())} tests skipped"
          + (f" ({sum(1 for n, _ in skips if n in gpu)} labelled gpu)" if gpu else ""))
    for name, reason in skips:
        if gpu and name in gpu:
            gpu_skips[reason].append(name)
            continue
        note = ""
        if args.ci:
            allowed = allowed_by(name, entries)
            if allowed:
                note = f"  [allowed: {allowed[0]}]"
            else:
                note = "  [NOT ALLOWED in CI]"
                forbidden.append(name)
        print(f"  [  SKIPPED ] {name}: {reason}{note}")
    for reason, names in gpu_skips.items():
        print(f"  [  SKIPPED ] {len(names)} gpu-labelled: {reason}: {', '.join(names)}")
    if forbidden:
        print(f"skips: FAILED (CI=true): {len(forbidden)} skipped test(s) neither labelled gpu "
              f"nor on {os.path.relpath(args.allowlist)}: {', '.join(forbidden)}")
        print("skips: install what they need (scripts/setup.sh, .ci/run) or, when the skip is "
              "legitimate here, add the test to the allow list with why")
    print(f"ctest: {counts['passed']} passed, {counts['failed']} failed, "
          f"{counts['skipped']} skipped")
    return 1 if forbidden else 0


if __name__ == "__main__":
    sys.exit(main())
