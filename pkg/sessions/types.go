package sessions

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/warmpool/warmpool/pkg/protocol"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

// Wire types of the data plane (data.warmpool.dev/v1alpha1). The server
// decodes requests into these and streams results in this shape.

// ExecRequest is the body of POST .../sessions/NAME/exec.
type ExecRequest struct {
	// ID names the run: sending the same ID again attaches to it (after a
	// dropped connection) instead of running the code twice. Empty: a new run.
	ID       string            `json:"id,omitempty"`
	Code     string            `json:"code"`
	Language string            `json:"language,omitempty"` // python (default) or shell
	Env      map[string]string `json:"env,omitempty"`      // os.environ for this run only
	// Context, any JSON value, becomes the interpreter's global `context`
	// from this run on (as the Session's spec.context does at the start).
	// Absent keeps the value it has.
	Context json.RawMessage `json:"context,omitempty"`
	// TimeoutMillis interrupts the code (SIGINT, KeyboardInterrupt) this long
	// after it started; 0: the agent's default. GraceMillis later the
	// interpreter is killed and the Session is Lost.
	TimeoutMillis  int64 `json:"timeoutMillis,omitempty"`
	GraceMillis    int64 `json:"graceMillis,omitempty"`
	MaxOutputBytes int   `json:"maxOutputBytes,omitempty"`
	Stream         bool  `json:"stream,omitempty"`
	// Bridge: llm_query/rlm_query calls in the code arrive as events for the
	// caller to answer (streamed runs only); MaxBridgeCalls bounds them.
	Bridge         bool `json:"bridge,omitempty"`
	MaxBridgeCalls int  `json:"maxBridgeCalls,omitempty"`
	// BridgeMethods: the memory functions (protocol.MemoryMethods) the
	// caller also answers, from its own chunk store.
	BridgeMethods []string `json:"bridgeMethods,omitempty"`
}

// RunRequest is the body of POST .../namespaces/NS/runs/NAME/exec: a new
// Session NAME of Pool and its first run, in one request. The data plane
// creates the Session (owned by the caller), waits until it holds a warm
// interpreter, runs the code in it and, unless Keep, closes it as the
// response ends. The response is an exec's.
type RunRequest struct {
	ExecRequest
	// Pool is the SandboxPool, in the namespace of the URL, to lease from.
	Pool string `json:"pool"`
	// Session names the new Session (NAME in the path, not in the body);
	// empty: RunOnce makes up a "run-" name. Named by the caller, it can be
	// asked about its run even when the response never arrives.
	Session string `json:"-"`
	// Keep leaves the Session open after the run, for more runs (its idle
	// timeout or the caller closes it); false closes it as the response ends.
	Keep bool `json:"keep,omitempty"`
	// IdleTimeoutMillis is the Session's idle timeout; 0: one minute without
	// Keep (a backstop should the close never come), the pool's with it.
	IdleTimeoutMillis int64 `json:"idleTimeoutMillis,omitempty"`
	// OwnerOnly binds the Session to the caller (spec.access Owner).
	OwnerOnly bool `json:"ownerOnly,omitempty"`
	// WaitMillis bounds the wait for a warm interpreter; 0: five minutes; at
	// most an hour.
	// Past it the Session is closed and the code has not run.
	WaitMillis int64 `json:"waitMillis,omitempty"`
}

// ForkRequest is the body of POST .../sessions/NAME/fork: Count new
// Sessions, each with a copy of NAME's state, made server-side (the
// snapshot never passes through the caller). The forks are the caller's
// (spec.owner), of the same pool, spec and access as NAME.
type ForkRequest struct {
	// Count of forks, 1-16; or the length of Names.
	Count int `json:"count,omitempty"`
	// Names of the forks; empty: NAME-fork-XXXXX.
	Names []string `json:"names,omitempty"`
	// Workspace copies the workspace's files too.
	Workspace bool `json:"workspace,omitempty"`
	// WaitMillis bounds the wait for the forks' pods; 0: 50 s (under the API
	// server's request timeout).
	WaitMillis int64 `json:"waitMillis,omitempty"`
}

// ForkResponse names the forks, Ready with the state, and what the snapshot
// they were made from holds.
type ForkResponse struct {
	Sessions []string           `json:"sessions"`
	Manifest *snapshot.Manifest `json:"manifest"`
}

// RestoreResponse answers POST .../sessions/NAME/restore.
type RestoreResponse = protocol.Restored

// RunRef names a run (interrupt).
type RunRef struct {
	ID string `json:"id"`
}

// BridgeAnswer answers one bridge call of a run: a JSON result, or an error
// the code sees as an exception.
type BridgeAnswer struct {
	ID     string          `json:"id"`
	Call   string          `json:"call"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// The events and results of a run are the agent's own (pkg/protocol, the
// wire contract every client is tested against with its golden streams):
// the data plane relays them as they are.

// Event types of a streamed run.
const (
	EventStdout  = protocol.EventStdout
	EventStderr  = protocol.EventStderr
	EventDisplay = protocol.EventDisplay
	EventBridge  = protocol.EventBridge
	EventResult  = protocol.EventResult
)

// Status of a finished run.
const (
	StatusSucceeded   = protocol.StatusSucceeded
	StatusFailed      = protocol.StatusFailed
	StatusInterrupted = protocol.StatusInterrupted
	StatusTimedOut    = protocol.StatusTimedOut
)

type (
	// Event is one line of a streamed run.
	Event = protocol.Event
	// BridgeCall is a call from the code (llm_query, rlm_query) for the caller to answer.
	BridgeCall = protocol.BridgeCall
	// Result of a run. StateLost: the interpreter was killed or died; the Session is lost.
	Result = protocol.Result
	// ResultError says why the code failed: a Python exception's name and
	// message, or one of the agent's own (InterpreterDied, InterpreterKilled,
	// InterpreterRestarted).
	ResultError = protocol.Error
	// RunInfo answers GET .../sessions/NAME/executions?id=ID.
	RunInfo = protocol.ExecutionInfo
	// Display is a rich result: a MIME bundle (text/plain always; image/png
	// as base64...).
	Display = protocol.Display
	// FileChange is a workspace file a run created or changed.
	FileChange = protocol.FileChange
	// Variable is a global of the interpreter: JSON when it serialises, else its repr.
	Variable = protocol.Variable
	// FileInfo describes a file or directory of the Session's workspace.
	FileInfo = protocol.FileInfo
)

// Error is a refusal of the data plane or the API server.
type Error struct {
	Code    int
	Reason  string
	Message string
	// RetryAfter is when the server said to try again (a 429: the data
	// plane's memory for forks was taken); 0 when it did not say.
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%d %s: %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("%d: %s", e.Code, e.Message)
}

// IsStatus reports whether err is an *Error with this HTTP status code.
func IsStatus(err error, code int) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}
