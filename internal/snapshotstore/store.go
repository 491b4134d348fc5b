// Package snapshotstore keeps the snapshots of suspended Sessions in an
// S3-compatible object store, encrypted with a key the manager keeps and
// bound to the Session they belong to.
//
// Each object is AES-256-GCM sealed; the additional data is the Session's
// namespace, UID and the object's key, so an object copied under another
// Session's key (or into another tenant's namespace) does not decrypt: a
// Session resumes only its own state. Objects live under
// PREFIX/sessions/NAMESPACE/UID/, which is what deleting a Session removes.
package snapshotstore

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"k8s.io/apimachinery/pkg/types"
)

// Config says where the store is. Credentials come from the manager's
// environment (a Secret in the Helm chart), never from a flag.
type Config struct {
	// Endpoint is host:port of the S3 API.
	Endpoint string
	Bucket   string
	Region   string
	// Insecure speaks plain HTTP (a store inside the cluster's network).
	Insecure bool
	// Prefix of every object's key.
	Prefix          string
	AccessKeyID     string
	SecretAccessKey string
	// MaxBytes bounds one snapshot (before encryption).
	MaxBytes int64
}

// DefaultMaxBytes bounds a snapshot the controllers suspend a Session with:
// they hold it twice in memory while they seal it, and their default memory
// limit is 256 MiB.
const DefaultMaxBytes = 64 << 20

// Enabled reports whether a store is configured.
func (c Config) Enabled() bool { return c.Endpoint != "" && c.Bucket != "" }

// Owner is the Session a snapshot belongs to.
type Owner struct {
	Namespace string
	UID       types.UID
}

// Store reads and writes sealed snapshots.
type Store struct {
	c     *minio.Client
	cfg   Config
	aead  cipher.AEAD
	keyID string
}

// ErrNotFound: no object under the key.
var ErrNotFound = errors.New("the snapshot is not in the store")

// ErrSealed: the object does not open for this Session with this key
// (another key, another Session's, altered, or not a sealed snapshot).
var ErrSealed = errors.New("the snapshot does not open")

// magic starts a sealed object; the key's ID follows, so a manager that
// has lost the key says so rather than reporting garbage.
const magic = "WPENC1\n"

// New connects to the store; key is the 32-byte AES-256 key.
func New(cfg Config, key []byte) (*Store, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("the snapshot key must be 32 bytes, not %d", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	c, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKeyID, cfg.SecretAccessKey, ""),
		Secure: !cfg.Insecure, Region: cfg.Region,
		Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 16, IdleConnTimeout: 90 * time.Second,
			ResponseHeaderTimeout: time.Minute},
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot store %s: %w", cfg.Endpoint, err)
	}
	sum := sha256.Sum256(key)
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	return &Store{c: c, cfg: cfg, aead: aead, keyID: hex.EncodeToString(sum[:4])}, nil
}

// MaxBytes bounds one snapshot.
func (s *Store) MaxBytes() int64 { return s.cfg.MaxBytes }

// String names the store for messages.
func (s *Store) String() string {
	return "s3://" + s.cfg.Bucket + "/" + s.cfg.Prefix + " at " + s.cfg.Endpoint
}

// EnsureBucket creates the bucket when it is missing.
func (s *Store) EnsureBucket(ctx context.Context) error {
	ok, err := s.c.BucketExists(ctx, s.cfg.Bucket)
	if err != nil {
		return fmt.Errorf("snapshot store %s: %w", s, err)
	}
	if ok {
		return nil
	}
	if err := s.c.MakeBucket(ctx, s.cfg.Bucket, minio.MakeBucketOptions{Region: s.cfg.Region}); err != nil {
		return fmt.Errorf("create bucket %s: %w", s.cfg.Bucket, err)
	}
	return nil
}

func (s *Store) dir(o Owner) string {
	return s.cfg.Prefix + "sessions/" + o.Namespace + "/" + string(o.UID) + "/"
}

func aad(o Owner, key string) []byte {
	return []byte("warmpool-snapshot/v1\x00" + o.Namespace + "\x00" + string(o.UID) + "\x00" + key)
}

// Put seals data for o and stores it under a new key, which it returns:
// a snapshot never overwrites the one a Session's status names.
func (s *Store) Put(ctx context.Context, o Owner, data []byte) (string, error) {
	return s.put(ctx, o, strconv.FormatInt(time.Now().UnixNano(), 10)+suffix, data)
}

// PutCheckpoint stores a durable Session's checkpoint, the state after its
// run number run, under a new key, which it returns.
func (s *Store) PutCheckpoint(ctx context.Context, o Owner, run int64, data []byte) (string, error) {
	return s.put(ctx, o, strconv.FormatInt(time.Now().UnixNano(), 10)+"-r"+strconv.FormatInt(run, 10)+suffix, data)
}

// suffix ends every snapshot's key. A key's name is the Unix nanoseconds it
// was stored at, then, for a checkpoint, "-r" and the run it is the state
// after: Latest orders by the first and reports the second, without
// reading the objects (the name is sealed into each, so it cannot be forged).
const suffix = ".wpsnap"

// Info describes a stored snapshot.
type Info struct {
	Key  string
	Time time.Time
	// Run is the run a checkpoint is the state after; 0 for a suspend's snapshot.
	Run int64
	// Bytes of the snapshot (before sealing).
	Bytes int64
}

// Latest returns o's newest snapshot, suspend's or checkpoint's, or
// ErrNotFound when o has none.
func (s *Store) Latest(ctx context.Context, o Owner) (Info, error) {
	var best Info
	for obj := range s.c.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: s.dir(o), Recursive: true}) {
		if obj.Err != nil {
			return Info{}, fmt.Errorf("list the snapshots of Session %s/%s: %w", o.Namespace, o.UID, obj.Err)
		}
		name, ok := strings.CutSuffix(strings.TrimPrefix(obj.Key, s.dir(o)), suffix)
		if !ok {
			continue
		}
		at, run, _ := strings.Cut(name, "-r")
		nanos, err := strconv.ParseInt(at, 10, 64)
		if err != nil {
			continue
		}
		i := Info{Key: obj.Key, Time: time.Unix(0, nanos), Bytes: max(obj.Size-s.sealing(), 0)}
		i.Run, _ = strconv.ParseInt(run, 10, 64)
		if best.Key == "" || i.Time.After(best.Time) {
			best = i
		}
	}
	if best.Key == "" {
		return Info{}, fmt.Errorf("%w: Session %s/%s has none", ErrNotFound, o.Namespace, o.UID)
	}
	return best, nil
}

// sealing is the bytes sealing adds to a snapshot.
func (s *Store) sealing() int64 {
	return int64(len(magic) + len(s.keyID) + s.aead.NonceSize() + s.aead.Overhead())
}

func (s *Store) put(ctx context.Context, o Owner, name string, data []byte) (string, error) {
	if int64(len(data)) > s.cfg.MaxBytes {
		return "", fmt.Errorf("the snapshot is %d bytes, more than the store's limit of %d", len(data), s.cfg.MaxBytes)
	}
	key := s.dir(o) + name
	nonce := make([]byte, s.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	out := make([]byte, 0, len(magic)+len(s.keyID)+len(nonce)+len(data)+s.aead.Overhead())
	out = append(out, magic...)
	out = append(out, s.keyID...)
	out = append(out, nonce...)
	out = s.aead.Seal(out, nonce, data, aad(o, key))
	if _, err := s.c.PutObject(ctx, s.cfg.Bucket, key, bytes.NewReader(out), int64(len(out)),
		minio.PutObjectOptions{ContentType: "application/octet-stream", DisableMultipart: len(out) < 64<<20}); err != nil {
		return "", fmt.Errorf("store the snapshot in %s: %w", s, err)
	}
	return key, nil
}

// Get reads and opens the snapshot under key, which must be o's.
func (s *Store) Get(ctx context.Context, o Owner, key string) ([]byte, error) {
	if !strings.HasPrefix(key, s.dir(o)) {
		return nil, fmt.Errorf("snapshot %q is not one of Session %s/%s's", key, o.Namespace, o.UID)
	}
	obj, err := s.c.GetObject(ctx, s.cfg.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("read snapshot %s: %w", key, err)
	}
	defer func() { _ = obj.Close() }()
	sealed, err := io.ReadAll(io.LimitReader(obj, s.cfg.MaxBytes+1024))
	if err != nil {
		if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
			return nil, fmt.Errorf("%w (%s)", ErrNotFound, key)
		}
		return nil, fmt.Errorf("read snapshot %s: %w", key, err)
	}
	head := len(magic) + len(s.keyID) + s.aead.NonceSize()
	switch {
	case len(sealed) < head || string(sealed[:len(magic)]) != magic:
		return nil, fmt.Errorf("%w: snapshot %s is not a sealed snapshot", ErrSealed, key)
	case string(sealed[len(magic):len(magic)+len(s.keyID)]) != s.keyID:
		return nil, fmt.Errorf("%w: snapshot %s was sealed with key %s, and the manager holds key %s", ErrSealed, key,
			sealed[len(magic):len(magic)+len(s.keyID)], s.keyID)
	}
	nonce := sealed[len(magic)+len(s.keyID) : head]
	data, err := s.aead.Open(nil, nonce, sealed[head:], aad(o, key))
	if err != nil {
		return nil, fmt.Errorf("%w: snapshot %s does not open for Session %s/%s (altered, or another Session's)", ErrSealed, key, o.Namespace, o.UID)
	}
	return data, nil
}

// Delete removes one snapshot.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.c.RemoveObject(ctx, s.cfg.Bucket, key, minio.RemoveObjectOptions{}); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", key, err)
	}
	return nil
}

// DeleteAll removes every snapshot of o but keep (when set).
func (s *Store) DeleteAll(ctx context.Context, o Owner, keep string) error {
	for obj := range s.c.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: s.dir(o), Recursive: true}) {
		if obj.Err != nil {
			return fmt.Errorf("list the snapshots of Session %s/%s: %w", o.Namespace, o.UID, obj.Err)
		}
		if obj.Key == keep {
			continue
		}
		if err := s.Delete(ctx, obj.Key); err != nil {
			return err
		}
	}
	return nil
}
