package servingcert

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func secretOf(ca, cert, key []byte) *corev1.Secret {
	return &corev1.Secret{Data: map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key, KeyCA: ca}}
}

func TestUsable(t *testing.T) {
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	dns := []string{"warmpool-data-plane.warmpool-system.svc", "warmpool-data-plane.warmpool-system.svc.cluster.local"}
	ca, cert, key, err := issue(dns, now)
	if err != nil {
		t.Fatal(err)
	}
	otherCA, _, _, err := issue(dns, now)
	if err != nil {
		t.Fatal(err)
	}
	_, otherCert, otherKey, err := issue(dns, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		sec  *corev1.Secret
		dns  []string
		at   time.Time
		want bool
	}{
		{"fresh", secretOf(ca, cert, key), dns, now, true},
		{"a month before the end of its year", secretOf(ca, cert, key), dns, now.Add(Validity - RenewBefore - 24*time.Hour), true},
		{"within the renewal window", secretOf(ca, cert, key), dns, now.Add(Validity - RenewBefore + time.Hour), false},
		{"expired", secretOf(ca, cert, key), dns, now.Add(Validity + time.Hour), false},
		{"for another Service", secretOf(ca, cert, key), []string{"other.warmpool-system.svc"}, now, false},
		{"not signed by the CA it names", secretOf(otherCA, cert, key), dns, now, false},
		{"a key of another certificate", secretOf(ca, cert, otherKey), dns, now, false},
		{"a certificate of another CA with its own key", secretOf(ca, otherCert, otherKey), dns, now, false},
		{"empty", &corev1.Secret{}, dns, now, false},
	} {
		if got := usable(tc.sec, tc.dns, tc.at); got != tc.want {
			t.Errorf("%s: usable = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestBundleKeepsThePreviousCAWhileItIsValid(t *testing.T) {
	now := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	dns := []string{"x.y.svc"}
	oldCA, _, _, _ := issue(dns, now)
	newCA, cert, key, _ := issue(dns, now.Add(Validity-RenewBefore))
	sec := secretOf(newCA, cert, key)
	sec.Data[KeyPreviousCA] = oldCA
	if got := string(bundle(sec, now.Add(Validity-RenewBefore))); got != string(newCA)+string(oldCA) {
		t.Errorf("during the rotation the bundle must hold both CAs, got %q", got)
	}
	if got := string(bundle(sec, now.Add(Validity+time.Hour))); got != string(newCA) {
		t.Errorf("after the old CA expired the bundle must hold the new one alone, got %q", got)
	}
}
