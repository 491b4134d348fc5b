package snapshot

import (
	"bytes"
	"strings"
	"testing"
)

// A sender that sends more than a snapshot may be is cut off, not read on.
func TestReadAtMostRefusesMore(t *testing.T) {
	head := int64(len(Magic)) + 4 + MaxManifestBytes
	if b, err := ReadAtMost(bytes.NewReader(make([]byte, head+10)), 10); err != nil || int64(len(b)) != head+10 {
		t.Fatalf("at the limit: %d bytes, %v", len(b), err)
	}
	_, err := ReadAtMost(bytes.NewReader(make([]byte, head+11)), 10)
	if err == nil || !strings.Contains(err.Error(), "larger than the limit of 10 bytes") {
		t.Fatalf("over the limit: %v", err)
	}
}
