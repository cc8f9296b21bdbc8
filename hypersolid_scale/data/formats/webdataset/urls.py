"""WebDataset shard URLs: listing the shards data.path names, and opening one as a byte stream.

URLs: a local path, a brace pattern (`d/shard-{000000..000009}.tar`), `file:`, `pipe:<command>` (the
command writes the shard to stdout, e.g. `pipe:aws s3 cp s3://bucket/shard-000123.tar -`), `http(s)://`
(curl, as the library does), and any fsspec protocol (`s3://`, `gs://`, ... when fsspec and its backend,
e.g. s3fs or gcsfs, are installed; without gcsfs `gs://` falls back to the library's gsutil). Several
patterns are joined with top-level commas or `::`. What is read from the stream, and checked: shards.py.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import IO
from urllib.parse import urlparse
from urllib.request import url2pathname

import webdataset as wds
from braceexpand import braceexpand

from hypersolid_scale.safety.errors import DataError

# Schemes the webdataset library opens with a subprocess (shell command, curl, ...).
_LIBRARY_SCHEMES = {"pipe", "http", "https", "sftp", "ftps", "scp", "ais", "htgs", "hf"}
_SHARD_NAME = re.compile(r"(?:([^/\s:'\"]+)/)?([^/\s'\"]+\.(?:tar|tgz|tar\.gz))(?=$|[\s?#'\"])")


def is_local(url: str) -> bool:
    return urlparse(url).scheme in ("", "file")


def local_path(url: str) -> str:
    return url2pathname(urlparse(url).path) if url.startswith("file:") else url


def split_urls(urls: str) -> list[str]:
    """Top-level ',' / '::' separated patterns (a comma inside {...} belongs to its pattern), brace-expanded."""
    parts: list[str] = []
    cur: list[str] = []
    depth = i = 0
    while i < len(urls):
        c = urls[i]
        depth += {"{": 1, "[": 1, "}": -1, "]": -1}.get(c, 0)
        if depth <= 0 and (c == "," or urls.startswith("::", i)):
            parts.append("".join(cur))
            cur, i = [], i + (2 if c == ":" else 1)
            continue
        cur.append(c)
        i += 1
    parts.append("".join(cur))
    return [u for p in parts if p.strip() for u in braceexpand(p.strip())]


def expand_shards(urls: str) -> list[str]:
    """A local directory (its *.tar), or URL patterns -> shard URLs. Local shards must exist and be
    readable now; a remote one that cannot be read raises when it is first opened."""
    if is_local(urls) and os.path.isdir(local_path(urls)):
        shards = sorted(str(p) for p in Path(local_path(urls)).glob("*.tar"))
        if not shards:
            raise FileNotFoundError(f"no .tar shards in directory {urls!r}")
        return shards
    shards = split_urls(urls)
    if not shards:
        raise DataError(
            f"no shard URL in {urls!r}: set data.path to a directory of .tar shards or to a "
            "pattern such as 'dir/shard-{000000..000009}.tar'"
        )
    for s in shards:
        if is_local(s):
            if not os.path.isfile(local_path(s)):
                raise FileNotFoundError(f"shard {s!r} does not exist (from {urls!r})")
            if not os.access(local_path(s), os.R_OK):
                raise PermissionError(f"shard {s!r} is not readable")
    return shards


def open_url(url: str) -> IO[bytes]:
    """A readable binary stream of a local path or any URL the library or fsspec can open."""
    if is_local(url):
        return open(local_path(url), "rb")
    scheme = urlparse(url).scheme
    if scheme in _LIBRARY_SCHEMES and (scheme not in ("http", "https") or shutil.which("curl")):
        return wds.gopen(url, "rb")
    try:
        import fsspec

        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError) as e:
        if scheme in wds.gopen_schemes:  # e.g. gs:// through gsutil
            return wds.gopen(url, "rb")
        raise RuntimeError(
            f"cannot open {url!r}: {scheme}:// needs fsspec with its {scheme} backend ({e}); install it "
            f"(s3: pip install s3fs, gs: pip install gcsfs) or stream through a command, e.g. "
            f"'pipe:aws s3 cp {url} -'"
        ) from e
    return fsspec.open(url, "rb").open()


def shard_key(url: str) -> tuple[str, str] | None:
    """(split directory, file name) of the shard a URL or pipe command reads, e.g. ("train", "shard-000003.tar")."""
    found = list(_SHARD_NAME.finditer(url))
    return (found[-1].group(1) or "", found[-1].group(2)) if found else None
