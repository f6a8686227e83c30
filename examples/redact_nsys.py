"""Blank the environment, host, user, path and captured-output rows of an nsys SQLite export, in place.

    python examples/redact_nsys.py report.sqlite [more.sqlite ...]

What it changes (every other table is left as nsys wrote it):
  * TARGET_INFO_SYSTEM_ENV: DeviceEnvironment and Hostname values → '<redacted>'
  * META_DATA_CAPTURE: environment variables, display name, working directory, user → '<redacted>'
  * META_DATA_EXPORT: EXPORT_USER, EXPORT_HOST and the input/output paths → '<redacted>'
  * ProcessStreams: the captured stdout/stderr text and file names (in StringIds) → '<redacted>', rows deleted
  * StringIds: any string holding a process environment block (``OLDPWD=/ PATH=… HOME=…``) → '<redacted>'
Then VACUUM, so the old values are not left in free pages.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from pathlib import Path

REDACTED = "<redacted>"

STATEMENTS: tuple[tuple[str, str], ...] = (
    ("TARGET_INFO_SYSTEM_ENV", "UPDATE TARGET_INFO_SYSTEM_ENV SET value = :r "
                               "WHERE name IN ('DeviceEnvironment', 'Hostname')"),
    ("META_DATA_CAPTURE", "UPDATE META_DATA_CAPTURE SET value = :r WHERE name LIKE '%ENVIRONMENT%' "
                          "OR name IN ('DEVICE_DISPLAY_NAME') OR name LIKE '%WORKING_DIR' "
                          "OR name LIKE '%USER_NAME'"),
    ("META_DATA_EXPORT", "UPDATE META_DATA_EXPORT SET value = :r WHERE name IN ('EXPORT_USER', 'EXPORT_HOST') "
                         "OR name LIKE 'EXPORT_PARAM_%PATH%'"),
    ("ProcessStreams", "UPDATE StringIds SET value = :r WHERE id IN "
                       "(SELECT filenameId FROM ProcessStreams UNION SELECT contentId FROM ProcessStreams)"),
    ("ProcessStreams", "DELETE FROM ProcessStreams"),
)


_ENV_ASSIGNMENT = re.compile(r"(?:^|[\s\x00])[A-Za-z_][A-Za-z0-9_]*=")  # NUL- or space-separated


def looks_like_environment(value: object) -> bool:
    """A string holding a process environment block (``OLDPWD=/ PATH=… HOME=…``): nsys keeps the launched
    processes' environments in StringIds, where no table above reaches them."""
    if not isinstance(value, str):
        return False
    return len(_ENV_ASSIGNMENT.findall(value)) >= 3 and any(k in value for k in ("PATH=", "HOME=", "PWD="))


def redact(path: Path) -> list[str]:
    """Apply the statements whose table exists; returns what was done, one line per statement."""
    done: list[str] = []
    with sqlite3.connect(path) as db:
        db.create_function("looks_like_environment", 1, looks_like_environment, deterministic=True)
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "StringIds" in tables:
            cur = db.execute("UPDATE StringIds SET value = :r WHERE looks_like_environment(value)", {"r": REDACTED})
            done.append(f"UPDATE StringIds (environment blocks): {cur.rowcount} rows")
        for table, sql in STATEMENTS:
            if table in tables:
                cur = db.execute(sql, {"r": REDACTED} if ":r" in sql else {})
                done.append(f"{sql.split(' WHERE')[0]}: {cur.rowcount} rows")
    db = sqlite3.connect(path)
    try:
        db.execute("VACUUM")
    finally:
        db.close()
    return done


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv:
        for line in redact(Path(name)):
            print(f"{name}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
