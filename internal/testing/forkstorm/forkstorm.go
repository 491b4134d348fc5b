// Package forkstorm is the fork attack of issue 47, for the envtest and e2e
// suites alike: forks of Sessions holding tens of megabytes, sent at once,
// while another tenant runs code.
package forkstorm

import (
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/warmpool/warmpool/pkg/sessions"
)

// BigState is code that makes a Session hold 52 MB that no compression
// shrinks.
const BigState = "import os\nblob = os.urandom(52_000_000)\nlen(blob)"

// Outcome is what became of one round.
type Outcome struct {
	// Made: forks made. Refused: forks answered 429 (and when to retry) or
	// 409 (the Session busy with another fork's snapshot): nothing made.
	// Failed: anything else.
	Made    int
	Refused []*sessions.Error
	Failed  []error
	// BystanderRuns: the other tenant's runs answered during the round;
	// BystanderErr: the first that was not.
	BystanderRuns int
	BystanderErr  error
}

// Round sends perSource forks (count 1) of each of srcs at once, while
// bystander runs `1 + 1` one after another, and waits for all of them.
func Round(ctx context.Context, srcs []*sessions.Session, perSource int, bystander *sessions.Session) Outcome {
	var out Outcome
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, src := range srcs {
		for range perSource {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := src.Fork(ctx, sessions.ForkRequest{Count: 1})
				mu.Lock()
				defer mu.Unlock()
				var e *sessions.Error
				switch {
				case err == nil:
					out.Made++
				case errors.As(err, &e) && (e.Code == http.StatusTooManyRequests || e.Code == http.StatusConflict):
					out.Refused = append(out.Refused, e)
				default:
					out.Failed = append(out.Failed, err)
				}
			}()
		}
	}
	stop, ran := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ran)
		for {
			select {
			case <-stop:
				return
			default:
			}
			r, err := bystander.Run(ctx, sessions.ExecRequest{Code: "1 + 1"})
			if err == nil && r.Status != sessions.StatusSucceeded {
				err = errors.New("the bystander's run ended " + string(r.Status))
			}
			if err != nil {
				out.BystanderErr = err
				return
			}
			out.BystanderRuns++
		}
	}()
	wg.Wait()
	close(stop)
	<-ran
	return out
}
