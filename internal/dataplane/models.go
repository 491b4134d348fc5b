package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"

	"github.com/warmpool/warmpool/pkg/protocol"
)

// The kinds of line of an agent's event stream the relay tells apart. Events
// are objects whose first member is their type.
type lineKind int

const (
	lineOther lineKind = iota
	lineResult
	lineBridge
)

func classify(line []byte) lineKind {
	switch {
	case bytes.HasPrefix(line, []byte(`{"type":"result"`)):
		return lineResult
	case bytes.HasPrefix(line, []byte(`{"type":"bridge"`)):
		return lineBridge
	}
	return lineOther
}

// maxModelCallsInFlight bounds the model calls of one run answered at once,
// as the manager bounds an Execution's.
const maxModelCallsInFlight = 4

// modelCalls answers a run's llm_query calls from its pool's ModelEndpoint,
// aside from the relay: the stream goes on being read (and output relayed)
// while the model thinks.
type modelCalls struct {
	t     *target
	runID string
	model func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer
	slots chan struct{}
	wg    sync.WaitGroup
}

func newModelCalls(t *target, runID string, model func(context.Context, protocol.BridgeCall) protocol.BridgeAnswer) *modelCalls {
	return &modelCalls{t: t, runID: runID, model: model, slots: make(chan struct{}, maxModelCallsInFlight)}
}

// answer answers the bridge event in line. The code decides how many calls
// it makes (the agent's per-run bound applies inside the interpreter), so a
// run that floods calls waits here for a free slot.
func (m *modelCalls) answer(ctx context.Context, line []byte) {
	var ev protocol.Event
	if err := json.Unmarshal(line, &ev); err != nil || ev.Call == nil {
		return
	}
	select {
	case m.slots <- struct{}{}:
	case <-ctx.Done():
		return
	}
	call := *ev.Call
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer func() { <-m.slots }()
		// An answer the agent cannot take (the run ended meanwhile) has
		// nobody waiting for it.
		_ = m.t.agent.AnswerBridge(ctx, m.runID, call.ID, m.model(ctx, call))
	}()
}

// wait returns once no answer is being sent: the request's context, which
// the answers use, ends with the handler.
func (m *modelCalls) wait() { m.wg.Wait() }
