"""Map the answer of `edgeinfer device --json` (on stdin) to a provisioning family.

Prints "family<TAB>profile name", the family being one of pi, jetson, intel-ncs2, intel-npu, x86-64 or
unknown. It comes from the profile's setup_script (setup-pi.sh, setup-jetson.sh, setup-intel.sh,
install-agent.sh) when the answer has one, else from a "family" key, else from the words of the
profile's name. Exit status 3: a valid answer in which no profile matched; 1: not a device profile.

detect.sh runs this with whichever interpreter can import edgeinfer, which may be an older system
python: standard library only, and Python 3.8 syntax.
"""

from __future__ import annotations

import json
import re
import sys

NO_PROFILE_MATCHED = 3


def find_string(obj: object, key: str) -> str:
    """The first string value of ``key`` in a depth-first walk of ``obj``; "" when there is none."""
    if isinstance(obj, dict):
        if isinstance(obj.get(key), str):
            return obj[key]
        for value in obj.values():
            hit = find_string(value, key)
            if hit:
                return hit
    elif isinstance(obj, list):
        for value in obj:
            hit = find_string(value, key)
            if hit:
                return hit
    return ""


def profile_name(answer: dict) -> str:
    """The matched profile's name: "profile" as an object (its name or id) or a string, else "name"."""
    profile = answer.get("profile")
    if isinstance(profile, dict):
        return profile.get("name") or profile.get("id") or ""
    if isinstance(profile, str):
        return profile
    return answer.get("name") or ""


def family_of(script: str, family: str, name: str) -> str:
    """The family named by the setup script; without one, guessed from the family's and name's words."""
    words = set(re.split(r"[^a-z0-9]+", f"{family} {name}".lower())) - {""}

    def has(*prefixes: str) -> bool:
        return any(word.startswith(prefix) for prefix in prefixes for word in words)

    if script == "setup-pi.sh" or (not script and (has("raspberry", "rpi") or words & {"pi", "pi3", "pi4", "pi5"})):
        return "pi"
    if script == "setup-jetson.sh" or (not script and has("jetson", "tegra")):
        return "jetson"
    if script == "setup-intel.sh" or (not script and has("ncs2", "npu", "myriad")):
        return "intel-ncs2" if has("ncs2", "myriad", "movidius") else "intel-npu"
    if has("x86", "amd64"):
        return "x86-64"
    return "unknown"


def main() -> int:
    """Read the answer on stdin, print "family<TAB>name"; the exit status says why when nothing is printed."""
    answer = json.load(sys.stdin)
    if isinstance(answer, list):
        answer = answer[0] if answer else {}
    if not isinstance(answer, dict):
        return 1
    name = profile_name(answer)
    if not name:
        return NO_PROFILE_MATCHED  # a valid answer: no profile matched
    family = family_of(find_string(answer, "setup_script"), find_string(answer, "family"), name)
    print(family + "\t" + name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
