package ttl

import (
	"testing"
	"time"
)

func TestOfPrefersTheObjectThenThePool(t *testing.T) {
	zero, five, ten := int32(0), int32(5), int32(10)
	for _, c := range []struct {
		own, pool *int32
		want      time.Duration
	}{
		{nil, nil, Default},
		{nil, &ten, 10 * time.Second},
		{&five, &ten, 5 * time.Second},
		{&zero, &ten, 0}, // 0 is "delete at once", not unset
		{&five, nil, 5 * time.Second},
	} {
		if got := Of(c.own, c.pool); got != c.want {
			t.Errorf("Of(%v, %v) = %v, want %v", c.own, c.pool, got, c.want)
		}
	}
}

func TestLeft(t *testing.T) {
	ended := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := Left(ended, time.Minute, ended.Add(20*time.Second)); got != 40*time.Second {
		t.Errorf("got %v, want 40s", got)
	}
	if got := Left(ended, time.Minute, ended.Add(time.Minute)); got > 0 {
		t.Errorf("at the TTL: got %v, want <= 0", got)
	}
}
