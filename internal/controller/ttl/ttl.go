// Package ttl is the time-to-live policy of finished objects: an Execution
// or a Session is deleted its own ttlSecondsAfterFinished after it ended, else
// its pool's, else Default. Finished objects would otherwise pile up in etcd
// (an Execution with full output is up to ~700 KiB) for as long as the
// cluster lives.
package ttl

import "time"

// Default is the TTL when neither the object nor its pool sets one.
const Default = time.Hour

// Of is the TTL of an object that sets own (nil: unset) in a pool that sets
// pool (nil: unset, or the pool is not found).
func Of(own, pool *int32) time.Duration {
	switch {
	case own != nil:
		return time.Duration(*own) * time.Second
	case pool != nil:
		return time.Duration(*pool) * time.Second
	}
	return Default
}

// Left is how long an object that ended at ended, with TTL ttl, has still to
// live at now; zero or less: delete it.
func Left(ended time.Time, ttl time.Duration, now time.Time) time.Duration {
	return ended.Add(ttl).Sub(now)
}
