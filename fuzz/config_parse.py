"""Target: configuration parsing (curvine_py/common/config.py): a TOML file, CURVINE_*
variables, sizes and address lists, as every process reads them at start.

Checks: bad input is a ConfigError (the CLI's one-line error), nothing else; a loaded
config has every key of the type its dataclass declares; ``to_toml`` (what ``cv config``
prints and ``cv cluster start`` writes) loads back to the same config."""
from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
import typing

from curvine_py.common import config
from curvine_py.common.errors import ConfigError
from fuzz.draw import Draw
from fuzz.harness import MAX_INPUT, Finding, run

_KEYS = [(s, f.name) for s in config.SECTIONS for f in dataclasses.fields(config.Config().section(s))]
_TYPES = {(s, k): typing.get_type_hints(type(config.Config().section(s)))[k] for s, k in _KEYS}
_dir = ""


def fuzz_one(data: bytes) -> None:
    data = data[:MAX_INPUT]
    draw = Draw(data)
    mode = draw.byte() % 3
    if mode == 0:
        _file(data[1:])
    elif mode == 1:
        _env(draw)
    else:
        text = draw.text(128)
        _quiet(config.parse_size, text)
        config.addresses(text)


def _scratch() -> str:
    global _dir
    if not _dir:
        _dir = tempfile.mkdtemp(prefix="fuzz-config-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        atexit.register(shutil.rmtree, _dir, True)
    return _dir


def _file(text: bytes) -> None:
    path = os.path.join(_scratch(), "curvine.toml")
    with open(path, "wb") as f:
        f.write(text)
    cfg = config.Config()
    if _quiet(config.load_file, cfg, path):
        check(cfg)


def _env(draw: Draw) -> None:
    environ: dict[str, str] = {}
    for _ in range(draw.byte() % 4 + 1):
        if draw.byte() & 3:
            section, key = draw.choice(_KEYS)
            name = f"CURVINE_{section.upper()}_{key.upper()}"
        else:
            name = "CURVINE_" + draw.text(24).replace("\0", "")
        environ[name] = draw.text(48).replace("\0", "")
    cfg = config.Config()
    if _quiet(config.apply_env, cfg, environ):
        check(cfg)


def _quiet(fn: typing.Callable[..., typing.Any], *args: typing.Any) -> bool:
    """fn(*args); False when it refused the input with ConfigError (expected)."""
    try:
        fn(*args)
    except ConfigError:
        return False
    return True


def check(cfg: config.Config) -> None:
    for section, key in _KEYS:
        value = getattr(cfg.section(section), key)
        want = _TYPES[section, key]
        kind = typing.get_origin(want) or want
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise Finding(f"{section}.{key} = {value!r} is not a {want}")
    path = os.path.join(_scratch(), "printed.toml")
    with open(path, "w") as f:
        f.write(config.to_toml(cfg))
    again = config.Config()
    try:
        config.load_file(again, path)
    except ConfigError as e:
        raise Finding(f"to_toml printed a config that does not load: {e}") from None
    if not _same(again, cfg):
        raise Finding(f"to_toml does not load back to the same config: {cfg} != {again}")


def _same(a: config.Config, b: config.Config) -> bool:
    """Equal, NaN equal to NaN (a float key may be nan)."""
    return repr(a) == repr(b)


def main() -> None:
    run(fuzz_one, also=("tomllib",))


if __name__ == "__main__":
    main()
