"""`python -m pdmtp_emulator engine vllm serve MODEL ...` | `python -m pdmtp_emulator load ...`"""

from __future__ import annotations

import sys

from pdmtp_emulator import load, serve


def main() -> int:
    commands = {"engine": serve.main, "load": load.main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print("usage: python -m pdmtp_emulator {engine vllm serve MODEL ...|load ...}")
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
