// Package protocol is warmpool's wire contract, version /v1: the agent's HTTP
// API and what the data plane relays of it (runs, their NDJSON events and
// results, bridge calls, variables, files), the defaults every side assumes,
// and the error names and event kinds a client acts on. The manager, the
// agent, the Go client (pkg/sessions) and the Python client are tested
// against the golden streams in testdata/.
package protocol

import (
	"encoding/json"
	"time"
)

// Version is the version of this wire contract an agent of this build
// speaks, reported in its Health. It changes only when a change would break a
// manager or agent of the previous release. An agent that reports none
// predates versions: it speaks 1.
const Version = 1

// OldestVersion is the oldest contract version a manager of this build still
// speaks. A manager calls agents of OldestVersion through Version and has
// its pools replace the pods of any other (docs/upgrades.md): a release
// that raises Version keeps OldestVersion at the previous one, so the pods
// of the previous release keep serving through an upgrade.
const OldestVersion = 1

// Supports reports whether this build speaks contract version v (0, from an
// agent that predates versions, is 1).
func Supports(v int) bool {
	if v == 0 {
		v = 1
	}
	return v >= OldestVersion && v <= Version
}

// API paths.
const (
	PathExecute   = "/v1/execute"
	PathExecution = "/v1/executions/{id}"
	PathInterrupt = "/v1/executions/{id}/interrupt"
	PathBridge    = "/v1/executions/{id}/bridge/{call}"
	PathVariable  = "/v1/variables/{name}"
	PathReset     = "/v1/reset"
	PathShell     = "/v1/shell"
	PathFileRead  = "/v1/files/read"
	PathFileWrite = "/v1/files/write"
	PathFileList  = "/v1/files/list"
	PathFileStat  = "/v1/files/stat"
	PathSnapshot  = "/v1/snapshot"
	PathRestore   = "/v1/restore"
	PathUnseal    = "/v1/unseal"
	// PathQuiet answers (Quiet) once the agent has started more than
	// QueryAfter runs and none is under way, or after QueryWaitMillis: a
	// durable Session's checkpointer waits there for a run to end.
	PathQuiet   = "/v1/quiet"
	PathHealthz = "/v1/healthz"
	PathReadyz  = "/v1/readyz"
)

// QueryWipe, set to "true" on PathReset, also empties the workspace and the
// agent's scratch directories once the interpreter is replaced: the pod is
// passed to another user, who must find none of the last one's files.
const QueryWipe = "wipe"

// ContentTypeNDJSON asks execute for a stream of Events instead of one Result.
const ContentTypeNDJSON = "application/x-ndjson"

// Language of an execution.
const (
	LanguagePython = "python"
	LanguageShell  = "shell"
)

// ExecuteRequest asks the agent to run code.
type ExecuteRequest struct {
	// ID makes the call idempotent: the same ID attaches to the execution
	// already running (or returns its result) instead of running the code twice.
	ID string `json:"id"`
	// Code to run.
	Code string `json:"code"`
	// Language: python (default) or shell.
	Language string `json:"language,omitempty"`
	// Context is any JSON value; Python sees it as the variable `context`.
	// Absent keeps the previous value.
	Context json.RawMessage `json:"context,omitempty"`
	// Env is set in os.environ for this run only.
	Env map[string]string `json:"env,omitempty"`
	// TimeoutMillis interrupts the code (SIGINT) this long after it started. 0: the agent's default.
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
	// GraceMillis is how long interrupted code may take to stop before the
	// interpreter is killed and restarted. 0: the agent's default.
	GraceMillis int64 `json:"graceMillis,omitempty"`
	// MaxOutputBytes kept of each of stdout and stderr. 0: the agent's default.
	MaxOutputBytes int `json:"maxOutputBytes,omitempty"`
	// Stream asks for NDJSON events (same as Accept: application/x-ndjson).
	Stream bool `json:"stream,omitempty"`
	// Bridge says the caller answers llm_query/rlm_query calls sent as events
	// (streaming only). Without it those functions raise a clear error.
	Bridge bool `json:"bridge,omitempty"`
	// MaxBridgeCalls per execution; 0: the agent's default.
	MaxBridgeCalls int `json:"maxBridgeCalls,omitempty"`
	// BridgeMethods names the memory functions (MemoryMethods) the caller
	// also answers with Bridge: read_chunk and the others then ask the
	// caller's chunk store instead of searching `context`.
	BridgeMethods []string `json:"bridgeMethods,omitempty"`
	// Session routes executions of one session to the same interpreter when the
	// agent runs several (daemon mode with --workers).
	Session string `json:"session,omitempty"`
	// Interpreter, when set, is the Result.Interpreter of the session's last
	// run: the code runs only on that same interpreter process. If it died or
	// was replaced since (its state is gone), the agent does not run the code
	// and answers a failed Result of type ErrorInterpreterRestarted.
	Interpreter string `json:"interpreter,omitempty"`
	// Resumed: the run's Session was resumed from a snapshot for it; the
	// agent says so in the run's Result.
	Resumed bool `json:"resumed,omitempty"`
}

// MemoryMethods are the memory functions of the interpreter a caller may
// answer over the bridge (ExecuteRequest.BridgeMethods).
var MemoryMethods = []string{"read_chunk", "search_chunks", "list_chunks_by_tag", "get_linked_chunks"}

// Status of a finished execution.
type Status string

const (
	// StatusSucceeded: the code ran to its end (or called FINAL); shell: exit code 0.
	StatusSucceeded Status = "succeeded"
	// StatusFailed: the code raised, the interpreter died, or shell exited non-zero.
	StatusFailed Status = "failed"
	// StatusInterrupted: stopped by an interrupt request.
	StatusInterrupted Status = "interrupted"
	// StatusTimedOut: stopped at its timeout.
	StatusTimedOut Status = "timed_out"
)

// Error types the agent reports itself (besides Python's exception names).
const (
	ErrorInterpreterDied   = "InterpreterDied"
	ErrorInterpreterKilled = "InterpreterKilled"
	// ErrorInterpreterRestarted: the request named an interpreter (its session's)
	// that is no longer the one running; the code did not run.
	ErrorInterpreterRestarted = "InterpreterRestarted"
	// ErrorMemoryLimitExceeded: the run's processes were killed for using
	// more memory than the sandbox's budget together.
	ErrorMemoryLimitExceeded = "MemoryLimitExceeded"
)

// Error describes why the code failed.
type Error struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	Traceback string `json:"traceback,omitempty"`
}

// Result of an execution.
type Result struct {
	ID     string `json:"id"`
	Status Status `json:"status"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// StdoutTruncated is true when stdout was cut to MaxOutputBytes; the cut is
	// marked in Stdout with the number of bytes left out.
	StdoutTruncated bool `json:"stdoutTruncated,omitempty"`
	StderrTruncated bool `json:"stderrTruncated,omitempty"`
	// Result is the FINAL() value or the repr of the trailing expression.
	Result *string `json:"result,omitempty"`
	// Final is true when the code called FINAL.
	Final bool   `json:"final,omitempty"`
	Error *Error `json:"error,omitempty"`
	// ExitCode of a shell execution.
	ExitCode *int `json:"exitCode,omitempty"`
	// StateLost is true when the interpreter was killed or died, so variables
	// and imports of earlier executions are gone.
	StateLost bool `json:"stateLost,omitempty"`
	// StateLostReason says why the state was lost: how the interpreter ended
	// (its exit code or signal), or why the agent ended or replaced it.
	StateLostReason string `json:"stateLostReason,omitempty"`
	// Displays are the rich results of the run, in the order the code made
	// them: display(obj) calls, open matplotlib figures, and the last
	// expression when it has a rich form (Main).
	Displays []Display `json:"displays,omitempty"`
	// Files the run created or changed in the workspace, at most
	// MaxFileChanges of them.
	Files []FileChange `json:"files,omitempty"`
	// Interpreter identifies the interpreter process that ran the code (new
	// with each start of an interpreter), for ExecuteRequest.Interpreter.
	Interpreter    string    `json:"interpreter,omitempty"`
	StartedAt      time.Time `json:"startedAt"`
	FinishedAt     time.Time `json:"finishedAt"`
	DurationMillis float64   `json:"durationMillis"`
	// Resumed: the Session was Suspended, and was resumed on this pod, with
	// its state, for this run.
	Resumed bool `json:"resumed,omitempty"`
	// Moved: the Session moved to this pod, off a drained node, since its
	// previous run (said once, in the first run after the move).
	Moved *Moved `json:"moved,omitempty"`
	// Run is the run's number in its Session (1 for its first run), counted
	// across moves and resumes: a Session restored from a checkpoint says
	// which run its state is from (Moved.Run), and the runs after it are to
	// be redone.
	Run int64 `json:"run,omitempty"`
}

// Event types of a streamed execution.
const (
	EventStdout  = "stdout"
	EventStderr  = "stderr"
	EventDisplay = "display"
	EventBridge  = "bridge"
	EventResult  = "result"
)

// Event is one line of a streamed execution.
type Event struct {
	Type    string      `json:"type"`
	Data    string      `json:"data,omitempty"`
	Display *Display    `json:"display,omitempty"`
	Call    *BridgeCall `json:"call,omitempty"`
	Result  *Result     `json:"result,omitempty"`
}

// Display is one rich result: a MIME bundle, as Jupyter's display_data.
type Display struct {
	// Data maps a MIME type to the content: text for text types
	// (text/plain, always present; text/html, image/svg+xml, text/markdown,
	// text/latex), base64 for binary ones (image/png, image/jpeg), any JSON
	// value for application/json.
	Data map[string]json.RawMessage `json:"data"`
	// Main marks the run's last expression (E2B's is_main_result).
	Main bool `json:"main,omitempty"`
	// Omitted lists the MIME types left out of Data because they were over
	// a limit (per result or per run); text/plain says so too.
	Omitted []string `json:"omitted,omitempty"`
}

// MIME types of a Display's Data whose content is base64.
var BinaryMIMETypes = []string{"image/png", "image/jpeg", "image/gif", "application/pdf"}

// FileChange is a file of the workspace a run created or changed.
type FileChange struct {
	// Path from the workspace's root, as the file API takes it.
	Path string `json:"path"`
	Size int64  `json:"size"`
	// Created is true for a file that did not exist before the run.
	Created bool `json:"created,omitempty"`
}

// BridgeCall is a call from the code (llm_query, rlm_query) that the caller answers
// with POST /v1/executions/{id}/bridge/{call}.
type BridgeCall struct {
	ID     string          `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
}

// BridgeAnswer answers a BridgeCall: a result, or an error message that the code sees as RuntimeError.
type BridgeAnswer struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// ExecutionInfo answers GET /v1/executions/{id}.
type ExecutionInfo struct {
	ID      string  `json:"id"`
	Running bool    `json:"running"`
	Result  *Result `json:"result,omitempty"`
}

// Variable answers GET /v1/variables/{name}: JSON where the value serialises, else its repr.
type Variable struct {
	Name string          `json:"name"`
	Type string          `json:"type"`
	JSON json.RawMessage `json:"json,omitempty"`
	Repr string          `json:"repr,omitempty"`
}

// ShellRequest runs a command with /bin/sh -c in the workspace.
type ShellRequest struct {
	Command        string            `json:"command"`
	Env            map[string]string `json:"env,omitempty"`
	TimeoutMillis  int64             `json:"timeoutMillis,omitempty"`
	MaxOutputBytes int               `json:"maxOutputBytes,omitempty"`
}

// ShellResult is the outcome of a shell command.
type ShellResult struct {
	ExitCode        int     `json:"exitCode"`
	Stdout          string  `json:"stdout"`
	Stderr          string  `json:"stderr"`
	StdoutTruncated bool    `json:"stdoutTruncated,omitempty"`
	StderrTruncated bool    `json:"stderrTruncated,omitempty"`
	TimedOut        bool    `json:"timedOut,omitempty"`
	DurationMillis  float64 `json:"durationMillis"`
}

// FileInfo describes a file or directory of the workspace.
type FileInfo struct {
	Path    string    `json:"path"`
	Name    string    `json:"name"`
	Size    int64     `json:"size"`
	Dir     bool      `json:"dir"`
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"modTime"`
}

// Health answers /v1/healthz and /v1/readyz.
type Health struct {
	OK        bool     `json:"ok"`
	Message   string   `json:"message,omitempty"`
	Python    string   `json:"python,omitempty"`
	Preloaded []string `json:"preloaded,omitempty"`
	Workers   int      `json:"workers,omitempty"`
	Busy      int      `json:"busy,omitempty"`
	// Interpreter is the tag of the running interpreter process (with one
	// worker): a session whose interpreter changed has lost its state.
	Interpreter string `json:"interpreter,omitempty"`
	// Runs counts the executions the agent started; LastActivity is when it
	// last answered an authenticated request. A Session's idle timeout is
	// judged from them, so runs through the data plane need no API write.
	Runs         int64      `json:"runs,omitempty"`
	LastActivity *time.Time `json:"lastActivity,omitempty"`
	// Sealed: a snapshot sealed the sandbox (QuerySeal); nothing runs in it.
	Sealed bool `json:"sealed,omitempty"`
	// Protocol is the contract version the agent speaks (Version of its
	// build); 0 from an agent that predates versions, which speaks 1.
	Protocol int `json:"protocol,omitempty"`
	// Agent is the agent's build (its release, or the commit it was built from).
	Agent string `json:"agent,omitempty"`
	// Containment says how the interpreter is kept apart from the agent:
	// "namespaces" (its own user, PID and IPC namespaces: the code cannot
	// signal or trace the agent) or "process-tree" (the kernel refused new
	// namespaces; docs/security.md says what that leaves open).
	Containment string `json:"containment,omitempty"`
	// LastEnd says why the interpreter before this one ended (its exit code or
	// signal, or why the agent ended it), with one worker; "" if none did
	// but by a reset.
	LastEnd string `json:"lastEnd,omitempty"`
}

// ErrorBody is every non-2xx answer.
type ErrorBody struct {
	Error string `json:"error"`
	// Reason, when set, names the error for a program (ReasonSealed).
	Reason string `json:"reason,omitempty"`
}

// ReasonSealed: the sandbox was sealed by a snapshot that moves its Session
// elsewhere (a suspend); nothing more runs in it. Retry once the Session is
// Suspended or Ready on its next pod.
const ReasonSealed = "Sealed"

// Query parameters of PathSnapshot: QuerySeal refuses every run, shell
// command, file write and restore after the snapshot until PathUnseal or a
// reset, so nothing changes the state the snapshot took; QueryWorkspace
// adds the workspace's files; QueryMaxBytes bounds the snapshot.
const (
	QuerySeal      = "seal"
	QueryWorkspace = "workspace"
	QueryMaxBytes  = "maxBytes"
	// QueryUnseal, on PathRestore, lifts a seal before the restore: the
	// manager resuming a Session on the pod it was suspended from.
	QueryUnseal = "unseal"
	// QueryMoved, on PathRestore: the restore moves the Session off a node
	// being drained. Its value, a Moved as JSON (MaxMovedBytes at most), is
	// given back once, in the result of the next run (Result.Moved).
	QueryMoved = "moved"
	// QueryRuns, on PathRestore: the number of runs the restored state has
	// seen; the next run is numbered one more (Result.Run).
	QueryRuns = "runs"
	// QueryCheckpoint, on PathSnapshot: a checkpoint of a durable Session,
	// which is not the Session's activity (its idle timeout goes on).
	QueryCheckpoint = "checkpoint"
	// QueryAfter and QueryWaitMillis, on PathQuiet.
	QueryAfter      = "after"
	QueryWaitMillis = "waitMillis"
)

// MaxQuietWait bounds QueryWaitMillis.
const MaxQuietWait = time.Minute

// Quiet answers PathQuiet.
type Quiet struct {
	// Runs started so far (as Result.Run counts them).
	Runs int64 `json:"runs"`
	// Quiet: more than QueryAfter runs were started, and nothing runs now.
	Quiet bool `json:"quiet"`
}

// MaxMovedBytes bounds QueryMoved's value.
const MaxMovedBytes = 2048

// Moved says the Session moved to this pod since its previous run: with its
// state, off a node being drained, or (Checkpoint) with its last
// checkpoint's, after its pod or node was lost.
type Moved struct {
	FromNode string `json:"fromNode"`
	ToNode   string `json:"toNode,omitempty"`
	// Reason is why the node was being emptied (cordoned, a taint), or how
	// the pod or node was lost.
	Reason string `json:"reason,omitempty"`
	// Since is when the move began: its running step had ended.
	Since time.Time `json:"since"`
	// Run is the number of the Session's last run whose state moved (Result.Run).
	Run int64 `json:"run,omitempty"`
	// Checkpoint, when set, is when the checkpoint the Session was restored
	// from was taken: its pod or node was lost (Reason), and the runs after
	// Run are not in its state.
	Checkpoint *time.Time `json:"checkpoint,omitempty"`
}

// Restored answers PathRestore.
type Restored struct {
	// Variables restored, and modules imported again that failed here.
	Variables     int               `json:"variables"`
	ModulesFailed map[string]string `json:"modulesFailed,omitempty"`
	// WorkspaceFiles written into the workspace.
	WorkspaceFiles int `json:"workspaceFiles,omitempty"`
}

// What the agent applies to a request that leaves a field out, and what
// every other side assumes of it: written here once.
const (
	DefaultTimeout        = 30 * time.Second
	DefaultGrace          = 5 * time.Second
	DefaultMaxOutputBytes = 64 << 10
	// DefaultMaxDisplayBytes bounds one Display's content, and
	// DefaultMaxRunDisplayBytes all of a run's: what is over is omitted
	// (Display.Omitted).
	DefaultMaxDisplayBytes    = 4 << 20
	DefaultMaxRunDisplayBytes = 16 << 20
	// MaxFileChanges bounds Result.Files; a run that changed more lists
	// the first ones.
	MaxFileChanges = 1000
)

// Millis turns a millisecond field into a duration; 0 (unset) gives def.
func Millis(ms int64, def time.Duration) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return def
}

// Finish stamps the result's end time and duration.
func (r *Result) Finish(now time.Time) *Result {
	r.FinishedAt = now
	r.DurationMillis = float64(now.Sub(r.StartedAt).Microseconds()) / 1000
	return r
}
