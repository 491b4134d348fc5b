package agentauth

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
)

func keyring(t *testing.T, current string, ids ...string) *Keyring {
	t.Helper()
	data := map[string][]byte{CurrentKey: []byte(current)}
	for _, id := range ids {
		data[id] = NewSeed()
	}
	k, err := ParseKeyring(data)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func verifier(t *testing.T, k *Keyring, podUID string) *Verifier {
	t.Helper()
	_, trusted := k.Current()
	v, err := NewVerifier(trusted, podUID)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestTokenOpensOnlyItsOwnPod(t *testing.T) {
	k := keyring(t, "k1", "k1")
	podA, podB := verifier(t, k, "uid-a"), verifier(t, k, "uid-b")
	tok, err := k.Token("uid-a", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if err := podA.Verify(tok); err != nil {
		t.Fatalf("pod A refused its own token: %v", err)
	}
	// The attack: code in pod A reads a token meant for A and calls pod B.
	err = podB.Verify(tok)
	if err == nil || !strings.Contains(err.Error(), "another sandbox") {
		t.Fatalf("pod B accepted pod A's token, or refused it for the wrong reason: %v", err)
	}
}

func TestRefusesForgedTamperedExpiredAndUntrusted(t *testing.T) {
	k := keyring(t, "k1", "k1")
	v := verifier(t, k, "uid-a")
	tok, _ := k.Token("uid-a", "k1")

	other := keyring(t, "k1", "k1") // same key ID, another secret key: a forger's
	forged, _ := other.Token("uid-a", "k1")
	if err := v.Verify(forged); err == nil || !strings.Contains(err.Error(), "signature") {
		t.Errorf("forged token: %v", err)
	}
	body, sig, _ := strings.Cut(strings.TrimPrefix(tok, tokenPrefix), ".")
	tampered := tokenPrefix + body[:len(body)-2] + "x" + body[len(body)-1:] + "." + sig
	if err := v.Verify(tampered); err == nil {
		t.Error("tampered token accepted")
	}
	for _, bad := range []string{"", "wp1.", "wp1.a.b", "Bearer x", strings.Repeat("a", 4096)} {
		if err := v.Verify(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
	unknown := keyring(t, "k9", "k9")
	tokK9, _ := unknown.Token("uid-a", "k9")
	if err := v.Verify(tokK9); err == nil || !strings.Contains(err.Error(), "does not trust") {
		t.Errorf("token of an untrusted key ID: %v", err)
	}

	// Expiry: a token from 20 minutes ago is refused, also after it was once accepted.
	past := time.Now().Add(-20 * time.Minute)
	old := keyring(t, "k1", "k1")
	old.now = func() time.Time { return past }
	v2 := verifier(t, old, "uid-a")
	oldTok, _ := old.Token("uid-a", "k1")
	v2.now = func() time.Time { return past }
	if err := v2.Verify(oldTok); err != nil {
		t.Fatalf("fresh token refused: %v", err)
	}
	v2.now = time.Now
	if err := v2.Verify(oldTok); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired token: %v", err)
	}
}

func TestRotationKeepsOldPodsReachable(t *testing.T) {
	k := keyring(t, "k1", "k1")
	oldPod := verifier(t, k, "uid-old")
	oldKeyID, _ := k.Current()

	// Rotation: a second key is added and made current.
	data := map[string][]byte{CurrentKey: []byte("k2"), "k2": NewSeed()}
	k.mu.RLock()
	for id, key := range k.keys {
		data[id] = []byte(b64(key.Seed()))
	}
	k.mu.RUnlock()
	if err := k.Load(data); err != nil {
		t.Fatal(err)
	}
	newPod := verifier(t, k, "uid-new")
	if id, _ := k.Current(); id != "k2" {
		t.Fatalf("current key %s, want k2", id)
	}
	tokOld, err := k.Token("uid-old", oldKeyID)
	if err != nil {
		t.Fatal(err)
	}
	if err := oldPod.Verify(tokOld); err != nil {
		t.Errorf("a pod started before the rotation is cut off: %v", err)
	}
	tokNew, _ := k.Token("uid-new", "k2")
	if err := newPod.Verify(tokNew); err != nil {
		t.Errorf("new pod: %v", err)
	}
	// Once the old key is removed, the manager says so instead of sending a token that cannot work.
	delete(data, "k1")
	if err := k.Load(data); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Token("uid-old", "k1"); err == nil || !strings.Contains(err.Error(), "no key") {
		t.Errorf("token for a removed key: %v", err)
	}
}

func TestLoadRefusesBadSecrets(t *testing.T) {
	for name, data := range map[string]map[string][]byte{
		"no current":       {"k1": NewSeed()},
		"current missing":  {CurrentKey: []byte("k2"), "k1": NewSeed()},
		"short seed":       {CurrentKey: []byte("k1"), "k1": []byte("c2hvcnQ=")},
		"not base64":       {CurrentKey: []byte("k1"), "k1": []byte("!!!")},
		"bad key id":       {CurrentKey: []byte("K_1"), "K_1": NewSeed()},
		"empty secret":     {},
		"current is empty": {CurrentKey: []byte(""), "k1": NewSeed()},
	} {
		if _, err := ParseKeyring(data); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewVerifier("", "uid"); err == nil {
		t.Error("verifier without keys accepted")
	}
	if _, err := NewVerifier("k1=AAAA", "uid"); err == nil {
		t.Error("verifier with a short key accepted")
	}
	if _, err := NewVerifier("k1="+b64(make([]byte, 32)), ""); err == nil {
		t.Error("verifier without audience accepted")
	}
}

func TestLoadedOnlyAfterAGoodSecret(t *testing.T) {
	k := &Keyring{}
	if k.Loaded() {
		t.Fatal("an empty keyring says it is loaded")
	}
	if err := k.Load(map[string][]byte{CurrentKey: []byte("k2"), "k1": NewSeed()}); err == nil || k.Loaded() {
		t.Fatalf("a bad Secret loaded: err=%v loaded=%v", err, k.Loaded())
	}
	if err := k.Load(map[string][]byte{CurrentKey: []byte("k1"), "k1": NewSeed()}); err != nil || !k.Loaded() {
		t.Fatalf("a good Secret did not load: err=%v loaded=%v", err, k.Loaded())
	}
}

// benchVerifier is a verifier for pod "uid" and a token for it.
func benchVerifier(b *testing.B) (*Verifier, string) {
	k, err := ParseKeyring(map[string][]byte{CurrentKey: []byte("k1"), "k1": NewSeed()})
	if err != nil {
		b.Fatal(err)
	}
	_, trusted := k.Current()
	v, err := NewVerifier(trusted, "uid")
	if err != nil {
		b.Fatal(err)
	}
	tok, err := k.Token("uid", "k1")
	if err != nil {
		b.Fatal(err)
	}
	return v, tok
}

func BenchmarkVerifyFresh(b *testing.B) {
	v, tok := benchVerifier(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		v.mu.Lock()
		v.seen = map[string]time.Time{}
		v.mu.Unlock()
		if err := v.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerifyCached(b *testing.B) {
	v, tok := benchVerifier(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := v.Verify(tok); err != nil {
			b.Fatal(err)
		}
	}
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
