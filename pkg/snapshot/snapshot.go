// Package snapshot is the format of a Session's snapshot: its interpreter's
// namespace (and optionally its workspace files) as one stream a caller can
// keep, send back to restore, or inspect without running anything.
//
// A snapshot is
//
//	"WPSNAP1\n" | manifest length (uint32, big endian) | manifest (JSON) | sections
//
// The manifest says what is in it (Python version, variables, imported
// modules, what could not be saved and why) and lists the sections that
// follow, each with its length and SHA-256. The namespace section is a
// compressed pickle: only an interpreter in a sandbox ever unpickles it. The
// manager and the clients read the manifest alone (JSON), so a malicious
// snapshot can harm only the sandbox it is restored into.
package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"
	"time"
)

// Magic starts every snapshot; its last digit is the format's version.
const Magic = "WPSNAP1\n"

// MediaType is a snapshot's Content-Type on the wire.
const MediaType = "application/vnd.warmpool.snapshot"

// MaxManifestBytes bounds a manifest, so reading one costs little whatever
// the bytes claim.
const MaxManifestBytes = 4 << 20

// Sections of a snapshot, in the order they are written.
const (
	// SectionNamespace is the interpreter's namespace: a compressed pickle.
	SectionNamespace = "namespace"
	// SectionWorkspace is the workspace's regular files and directories: a tar.
	SectionWorkspace = "workspace"
)

// Manifest describes a snapshot.
type Manifest struct {
	// Format is the version of this layout (1).
	Format  int       `json:"format"`
	Created time.Time `json:"created"`
	// Python is the version of the interpreter that made it; a namespace is
	// restored only into the same major.minor (functions carry its bytecode).
	Python string `json:"python"`
	// Serializer and Compression of the namespace section.
	Serializer  string `json:"serializer"`
	Compression string `json:"compression"`
	// Variables kept, by name and type.
	Variables []Variable `json:"variables"`
	// Modules imported under a name (alias: module), imported again on restore.
	Modules map[string]string `json:"modules,omitempty"`
	// Skipped names what could not be saved (sockets, threads, generators,
	// open files...), with why: the rest was kept.
	Skipped []Skipped `json:"skipped,omitempty"`
	// Runs is how many runs the state has seen (the Session's, counted across
	// moves and resumes): a Session restored from it numbers its next run one more.
	Runs int64 `json:"runs,omitempty"`
	// Workspace summarises the workspace section, when there is one.
	Workspace *Workspace `json:"workspace,omitempty"`
	// Sections follow the manifest in this order.
	Sections []Section `json:"sections"`
}

// Variable is one saved name.
type Variable struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// Skipped is a name that could not be saved.
type Skipped struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	Reason string `json:"reason"`
}

// Workspace is what the workspace section holds.
type Workspace struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// Section is one part of the stream after the manifest.
type Section struct {
	Name   string `json:"name"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Size is the length of the whole snapshot with this manifest.
func (m *Manifest) Size() int64 {
	b, _ := json.Marshal(m)
	n := int64(len(Magic) + 4 + len(b))
	for _, s := range m.Sections {
		n += s.Bytes
	}
	return n
}

// Section returns the named section, if present.
func (m *Manifest) Section(name string) (Section, bool) {
	for _, s := range m.Sections {
		if s.Name == name {
			return s, true
		}
	}
	return Section{}, false
}

// PythonMinor is "3.11" of "3.11.2".
func PythonMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}

// Validate checks what a reader relies on before it reads the sections:
// the version, known sections in order, their lengths within limit.
func (m *Manifest) Validate(limit int64) error {
	if m.Format != 1 {
		return fmt.Errorf("snapshot format %d is not one this build reads (1)", m.Format)
	}
	if m.Python == "" || m.Compression == "" {
		return errors.New("the manifest names no Python version or compression")
	}
	var total int64
	for i, s := range m.Sections {
		switch {
		case s.Name != SectionNamespace && s.Name != SectionWorkspace:
			return fmt.Errorf("unknown section %q", s.Name)
		case i == 0 && s.Name != SectionNamespace, i == 1 && s.Name != SectionWorkspace, i > 1:
			return errors.New("sections must be namespace, then optionally workspace")
		case s.Bytes < 0 || len(s.SHA256) != 64:
			return fmt.Errorf("section %s has no valid length or SHA-256", s.Name)
		}
		total += s.Bytes
		if limit > 0 && total > limit {
			return fmt.Errorf("the snapshot is larger than the limit of %d bytes", limit)
		}
	}
	if len(m.Sections) == 0 {
		return errors.New("the snapshot has no namespace section")
	}
	return nil
}

// WriteHeader writes the magic and the manifest; the sections follow.
func WriteHeader(w io.Writer, m *Manifest) error {
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode the snapshot's manifest: %w", err)
	}
	if len(b) > MaxManifestBytes {
		return fmt.Errorf("the snapshot's manifest is %d bytes, more than %d (too many variables?)", len(b), MaxManifestBytes)
	}
	head := make([]byte, 0, len(Magic)+4+len(b))
	head = append(head, Magic...)
	head = binary.BigEndian.AppendUint32(head, uint32(len(b)))
	head = append(head, b...)
	_, err = w.Write(head)
	return err
}

// ErrNotSnapshot is returned for bytes that do not start as a snapshot does.
var ErrNotSnapshot = errors.New("not a warmpool snapshot (it does not start with " + strings.TrimSpace(Magic) + ")")

// ReadHeader reads the magic and the manifest, leaving r at the first section.
func ReadHeader(r io.Reader) (*Manifest, error) {
	var head [len(Magic) + 4]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, ErrNotSnapshot
		}
		return nil, fmt.Errorf("read the snapshot's header: %w", err)
	}
	if !bytes.Equal(head[:len(Magic)], []byte(Magic)) {
		return nil, ErrNotSnapshot
	}
	n := binary.BigEndian.Uint32(head[len(Magic):])
	if n > MaxManifestBytes {
		return nil, fmt.Errorf("the snapshot's manifest claims %d bytes, more than %d", n, MaxManifestBytes)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("read the snapshot's manifest: %w", err)
	}
	m := &Manifest{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("the snapshot's manifest is not valid JSON: %w", err)
	}
	return m, nil
}

// SectionReader reads exactly one section from r and fails at its end when
// the bytes are short or their SHA-256 is not the manifest's: a torn or
// altered snapshot is never restored.
func SectionReader(r io.Reader, s Section) io.Reader {
	return &verifying{r: io.LimitReader(r, s.Bytes), left: s.Bytes, h: sha256.New(), s: s}
}

type verifying struct {
	r    io.Reader
	left int64
	h    hash.Hash
	s    Section
}

func (v *verifying) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.left -= int64(n)
	if errors.Is(err, io.EOF) {
		if v.left > 0 {
			return n, fmt.Errorf("snapshot section %s ends %d bytes early: %w", v.s.Name, v.left, io.ErrUnexpectedEOF)
		}
		if got := hex.EncodeToString(v.h.Sum(nil)); got != v.s.SHA256 {
			return n, fmt.Errorf("snapshot section %s does not match its SHA-256 (altered or torn)", v.s.Name)
		}
	}
	return n, err
}

// ReadAtMost reads a whole snapshot of at most limit bytes of sections (and
// its manifest), failing instead of reading on when a sender sends more.
func ReadAtMost(r io.Reader, limit int64) ([]byte, error) {
	max := MaxSize(limit)
	b, err := io.ReadAll(io.LimitReader(r, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("the snapshot is larger than the limit of %d bytes", limit)
	}
	return b, nil
}

// MaxSize is the most bytes a snapshot whose sections hold at most limit
// bytes takes: the sections, the manifest and the framing.
func MaxSize(limit int64) int64 { return limit + MaxManifestBytes + int64(len(Magic)) + 4 }

// Hashed describes the bytes of a file written for a section.
func Hashed(name string, r io.Reader) (Section, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return Section{}, fmt.Errorf("hash snapshot section %s: %w", name, err)
	}
	return Section{Name: name, Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}
