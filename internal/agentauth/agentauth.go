// Package agentauth is how the manager proves to a sandbox's agent that a
// request comes from it, without giving the sandbox anything worth stealing.
//
// The manager holds Ed25519 signing keys (a Secret in its own namespace). A
// sandbox pod is started with the public key only and learns its own pod UID
// from the downward API. Every call to an agent carries a short-lived token
// signed by the manager for that one pod UID (the audience). Code in a sandbox
// can read the public key and its own pod UID, and neither lets it call any
// other sandbox: it cannot sign, and a token it might capture names its own pod.
//
// Rotating the key adds a new one and makes it current: pods started with the
// old key keep getting tokens signed with it (the pod records its key ID in a
// label) until they are replaced, so no running pod is cut off.
package agentauth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"
)

const (
	// tokenPrefix versions the token format.
	tokenPrefix = "wp1."
	// CurrentKey is the Secret key that names the key ID to sign new pods with.
	CurrentKey = "current"
	// TokenTTL is how long a minted token is valid.
	TokenTTL = 10 * time.Minute
	// clockSkew tolerated between the manager and a pod's node.
	clockSkew = time.Minute
)

// keyIDPattern keeps key IDs usable as Secret data keys and as label values.
var keyIDPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$`)

// claims is what a token asserts.
type claims struct {
	// Audience is the UID of the one pod the token opens.
	Audience string `json:"aud"`
	KeyID    string `json:"kid"`
	// Expiry in Unix seconds.
	Expiry int64 `json:"exp"`
}

// Keyring holds the manager's signing keys. It is safe for concurrent use and
// can be reloaded in place when the Secret changes.
type Keyring struct {
	mu      sync.RWMutex
	keys    map[string]ed25519.PrivateKey
	current string
	now     func() time.Time

	cache map[string]cachedToken // by audience + key ID
}

type cachedToken struct {
	token  string
	expiry time.Time
}

// NewSeed returns a new random key seed, as the Secret stores it.
func NewSeed() []byte {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		panic(fmt.Sprintf("agentauth: no randomness: %v", err))
	}
	return []byte(base64.StdEncoding.EncodeToString(seed))
}

// ParseKeyring reads keys from Secret data: CurrentKey names the key ID to
// sign new pods with, every other entry is a key ID mapped to a base64
// Ed25519 seed of 32 bytes (what `openssl rand -base64 32` prints).
func ParseKeyring(data map[string][]byte) (*Keyring, error) {
	k := &Keyring{now: time.Now}
	return k, k.Load(data)
}

// Load replaces the keys with those in data (see ParseKeyring). On error the
// keyring is left as it was.
func (k *Keyring) Load(data map[string][]byte) error {
	keys := map[string]ed25519.PrivateKey{}
	for id, v := range data {
		if id == CurrentKey {
			continue
		}
		if !keyIDPattern.MatchString(id) {
			return fmt.Errorf("key ID %q: use lowercase letters, digits and '-', at most 32 characters", id)
		}
		seed, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(v)))
		if err != nil || len(seed) != ed25519.SeedSize {
			return fmt.Errorf("key %q: want a base64 seed of %d bytes (openssl rand -base64 32)", id, ed25519.SeedSize)
		}
		keys[id] = ed25519.NewKeyFromSeed(seed)
	}
	current := strings.TrimSpace(string(data[CurrentKey]))
	if _, ok := keys[current]; !ok {
		return fmt.Errorf("%q names key %q, which is not in the Secret", CurrentKey, current)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keys, k.current, k.cache = keys, current, map[string]cachedToken{}
	if k.now == nil {
		k.now = time.Now
	}
	return nil
}

// Current returns the key ID new pods are started with and its public key in
// the form the agent's --trusted-keys flag takes.
func (k *Keyring) Current() (keyID, trusted string) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.keys == nil {
		return "", ""
	}
	return k.current, FormatTrustedKey(k.current, k.keys[k.current].Public().(ed25519.PublicKey))
}

// Loaded reports whether keys were loaded. Until then no pod can be called:
// a restarted manager must wait rather than judge running pods unreachable.
func (k *Keyring) Loaded() bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.keys != nil
}

// Has reports whether the keyring can still sign for pods started with keyID.
func (k *Keyring) Has(keyID string) bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	_, ok := k.keys[keyID]
	return ok
}

// Trusted returns the --trusted-keys value of a pod started with keyID (its
// public key), and false when the keyring has no such key.
func (k *Keyring) Trusted(keyID string) (string, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	key, ok := k.keys[keyID]
	if !ok {
		return "", false
	}
	return FormatTrustedKey(keyID, key.Public().(ed25519.PublicKey)), true
}

// KeyIDs lists the key IDs, sorted.
func (k *Keyring) KeyIDs() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	ids := make([]string, 0, len(k.keys))
	for id := range k.keys {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// Token returns a token that opens the agent of the pod with this UID, signed
// with the key the pod was started with. Tokens are reused until half their
// lifetime is gone.
func (k *Keyring) Token(podUID, keyID string) (string, error) {
	if podUID == "" {
		return "", errors.New("agentauth: no pod UID to address the token to")
	}
	now := time.Now()
	if k.now != nil {
		now = k.now()
	}
	cacheKey := podUID + "/" + keyID
	k.mu.RLock()
	c, hit := k.cache[cacheKey]
	key, ok := k.keys[keyID]
	k.mu.RUnlock()
	if hit && now.Add(TokenTTL/2).Before(c.expiry) {
		return c.token, nil
	}
	if !ok {
		return "", fmt.Errorf("agentauth: the manager has no key %q any more (removed from the keys Secret); pods started with it cannot be reached", keyID)
	}
	exp := now.Add(TokenTTL)
	body, _ := json.Marshal(claims{Audience: podUID, KeyID: keyID, Expiry: exp.Unix()})
	signed := tokenPrefix + base64.RawURLEncoding.EncodeToString(body)
	tok := signed + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(key, []byte(signed)))
	k.mu.Lock()
	if len(k.cache) > 4096 { // pods come and go; drop the lot rather than track each
		k.cache = map[string]cachedToken{}
	}
	k.cache[cacheKey] = cachedToken{token: tok, expiry: exp}
	k.mu.Unlock()
	return tok, nil
}

// FormatTrustedKey renders a public key for the agent's --trusted-keys flag.
func FormatTrustedKey(keyID string, pub ed25519.PublicKey) string {
	return keyID + "=" + base64.StdEncoding.EncodeToString(pub)
}

// Verifier checks tokens in an agent: signed by a trusted key, addressed to
// this pod, not expired.
type Verifier struct {
	keys     map[string]ed25519.PublicKey
	audience []byte
	now      func() time.Time

	mu sync.Mutex
	// seen caches tokens that verified, until they expire: the manager reuses a
	// token for minutes, so most requests skip the signature check.
	seen map[string]time.Time
}

// NewVerifier returns a Verifier for the pod with UID audience, trusting the
// keys of a --trusted-keys value ("ID=BASE64,ID=BASE64").
func NewVerifier(trusted, audience string) (*Verifier, error) {
	if audience == "" {
		return nil, errors.New("agentauth: no audience (the pod's UID) to check tokens against")
	}
	keys := map[string]ed25519.PublicKey{}
	for _, kv := range strings.Split(trusted, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		id, b64, ok := strings.Cut(kv, "=")
		pub, err := base64.StdEncoding.DecodeString(b64)
		if !ok || !keyIDPattern.MatchString(id) || err != nil || len(pub) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("agentauth: trusted key %q: want ID=BASE64 of a %d-byte Ed25519 public key", kv, ed25519.PublicKeySize)
		}
		keys[id] = pub
	}
	if len(keys) == 0 {
		return nil, errors.New("agentauth: no trusted keys")
	}
	return &Verifier{keys: keys, audience: []byte(audience), now: time.Now, seen: map[string]time.Time{}}, nil
}

// Verify returns nil when token opens this agent.
func (v *Verifier) Verify(token string) error {
	now := v.now()
	v.mu.Lock()
	exp, hit := v.seen[token]
	v.mu.Unlock()
	if hit && now.Before(exp.Add(clockSkew)) {
		return nil
	}
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok {
		return errors.New("not a warmpool agent token")
	}
	body64, sig64, ok := strings.Cut(rest, ".")
	if !ok {
		return errors.New("malformed token")
	}
	body, err1 := base64.RawURLEncoding.DecodeString(body64)
	sig, err2 := base64.RawURLEncoding.DecodeString(sig64)
	var c claims
	if err1 != nil || err2 != nil || json.Unmarshal(body, &c) != nil {
		return errors.New("malformed token")
	}
	pub, ok := v.keys[c.KeyID]
	if !ok {
		return fmt.Errorf("token signed with key %q, which this agent does not trust", c.KeyID)
	}
	if !ed25519.Verify(pub, []byte(tokenPrefix+body64), sig) {
		return errors.New("bad token signature")
	}
	if subtle.ConstantTimeCompare([]byte(c.Audience), v.audience) != 1 {
		return errors.New("token is for another sandbox")
	}
	expiry := time.Unix(c.Expiry, 0)
	if !now.Before(expiry.Add(clockSkew)) {
		return errors.New("token expired")
	}
	v.mu.Lock()
	if len(v.seen) >= 64 {
		v.seen = map[string]time.Time{}
	}
	v.seen[token] = expiry
	v.mu.Unlock()
	return nil
}
