// Snapshots of a Session's state, as the Go package pkg/snapshot writes them:
// "WPSNAP1\n", the manifest's length (uint32, big endian), the manifest
// (JSON), then the sections. This module reads the manifest and nothing
// else: the namespace is a pickle, which only an interpreter in a sandbox
// ever loads, so a snapshot from anyone can be inspected here safely.

export const SNAPSHOT_MAGIC = "WPSNAP1\n";
export const SNAPSHOT_MEDIA_TYPE = "application/vnd.warmpool.snapshot";

export interface SnapshotManifest {
  format: number;
  created: string;
  python: string;
  serializer: string;
  compression: string;
  variables: { name: string; type: string }[];
  modules?: Record<string, string>;
  /** What could not be saved (sockets, threads, generators, open files), with why. */
  skipped?: { name: string; type: string; reason: string }[];
  workspace?: { files: number; bytes: number };
  sections: { name: string; bytes: number; sha256: string }[];
}

/** The manifest of a snapshot's bytes; throws when they are not a snapshot. */
export function readManifest(data: Buffer): SnapshotManifest {
  const head = SNAPSHOT_MAGIC.length + 4;
  if (data.length < head || data.subarray(0, SNAPSHOT_MAGIC.length).toString("latin1") !== SNAPSHOT_MAGIC) {
    throw new Error("not a warmpool snapshot (it does not start with WPSNAP1)");
  }
  const n = data.readUInt32BE(SNAPSHOT_MAGIC.length);
  if (head + n > data.length) throw new Error(`the snapshot's manifest claims ${n} bytes, which the data does not hold`);
  const m = JSON.parse(data.subarray(head, head + n).toString("utf8")) as SnapshotManifest;
  if (m.format !== 1) throw new Error(`snapshot format ${m.format} is not 1`);
  return m;
}
