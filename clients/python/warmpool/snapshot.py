"""Snapshots of a Session's state (the interpreter's namespace, optionally its
workspace files), in the format of the Go package pkg/snapshot.

This module reads a snapshot's JSON manifest only: it never unpickles the
namespace, which only an interpreter in a sandbox loads. A snapshot from
anyone can be inspected here without running anything of it.
"""

import json
import struct

MAGIC = b"WPSNAP1\n"
MEDIA_TYPE = "application/vnd.warmpool.snapshot"
MAX_MANIFEST_BYTES = 4 << 20


class Snapshot:
    """A Session's state as bytes: keep it (``save``), restore it
    (``Sandbox.create(pool, snapshot=...)``), or look at what it holds
    (``variables``, ``skipped``, ``manifest``)."""

    def __init__(self, data):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("a Snapshot is made of bytes")
        self.data = bytes(data)
        self.manifest = read_manifest(self.data)

    @classmethod
    def load(cls, path):
        with open(path, "rb") as f:
            return cls(f.read())

    def save(self, path):
        with open(path, "wb") as f:
            f.write(self.data)

    @property
    def size(self):
        return len(self.data)

    @property
    def python(self):
        return self.manifest.get("python")

    @property
    def variables(self):
        """Names kept, with their types: ``{"x": "int", ...}``."""
        return {v["name"]: v["type"] for v in self.manifest.get("variables") or []}

    @property
    def modules(self):
        return dict(self.manifest.get("modules") or {})

    @property
    def skipped(self):
        """What could not be saved (sockets, threads, generators, open files):
        ``{name: reason}``. Everything else was kept."""
        return {s["name"]: s["reason"] for s in self.manifest.get("skipped") or []}

    def __bytes__(self):
        return self.data

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        return (f"Snapshot({len(self.data)} bytes, Python {self.python}, {len(self.variables)} variables"
                f"{', skipped ' + ', '.join(self.skipped) if self.skipped else ''})")


def read_manifest(data):
    """The manifest (a dict) of a snapshot's bytes; ValueError if they are not one."""
    head = len(MAGIC) + 4
    if len(data) < head or data[:len(MAGIC)] != MAGIC:
        raise ValueError("not a warmpool snapshot (it does not start with WPSNAP1)")
    (n,) = struct.unpack(">I", data[len(MAGIC):head])
    if n > MAX_MANIFEST_BYTES or head + n > len(data):
        raise ValueError(f"the snapshot's manifest claims {n} bytes, which the data does not hold")
    manifest = json.loads(data[head:head + n])
    if not isinstance(manifest, dict) or manifest.get("format") != 1:
        raise ValueError("the snapshot's manifest is not format 1")
    return manifest
