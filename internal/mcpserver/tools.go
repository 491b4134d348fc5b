package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/warmpool/warmpool/pkg/sessions"
)

// RunCodeInput is the input of run_code.
type RunCodeInput struct {
	Code           string  `json:"code" jsonschema:"Python source to run; the value of a last expression is returned as result"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" jsonschema:"interrupt the code (KeyboardInterrupt) after this many seconds; default the server's"`
	Context        any     `json:"context,omitempty" jsonschema:"any JSON value; becomes the global variable context from this run on"`
}

// RunCodeOutput is what run_code returns.
type RunCodeOutput struct {
	Status          string     `json:"status" jsonschema:"succeeded, failed, interrupted or timed_out"`
	Result          *string    `json:"result,omitempty" jsonschema:"repr of the last expression's value, or the answer given to FINAL"`
	Stdout          string     `json:"stdout"`
	Stderr          string     `json:"stderr"`
	Error           *CodeError `json:"error,omitempty"`
	StdoutTruncated bool       `json:"stdout_truncated,omitempty"`
	StderrTruncated bool       `json:"stderr_truncated,omitempty"`
	DurationSeconds float64    `json:"duration_seconds"`
	// Results are the rich results (charts, tables, display(obj)) by their
	// text and MIME types; images also come as image content of the result.
	Results []RichResult `json:"results,omitempty"`
	// Files the code created or changed in the sandbox (read_file reads them).
	Files []FileChange `json:"files,omitempty"`
}

// RichResult is a rich result of the code, by its text and MIME types.
type RichResult struct {
	Text      string   `json:"text"`
	MIMETypes []string `json:"mime_types"`
	Main      bool     `json:"main,omitempty" jsonschema:"true for the code's last expression"`
}

// FileChange is a file of the sandbox's workspace a run created or changed.
type FileChange struct {
	Path    string `json:"path"`
	Size    int64  `json:"size"`
	Created bool   `json:"created,omitempty"`
}

// imageTypes are the rich results an MCP client gets as image content.
var imageTypes = []string{"image/png", "image/jpeg", "image/gif"}

// richResults returns the run's rich results for the tool's output and its
// images as MCP image content, in order.
func richResults(res *sessions.Result) ([]RichResult, []mcp.Content) {
	var out []RichResult
	var images []mcp.Content
	for _, d := range res.Displays {
		r := RichResult{Main: d.Main}
		_ = json.Unmarshal(d.Data["text/plain"], &r.Text)
		for m := range d.Data {
			r.MIMETypes = append(r.MIMETypes, m)
		}
		sort.Strings(r.MIMETypes)
		out = append(out, r)
		for _, m := range imageTypes {
			var b64 string
			if json.Unmarshal(d.Data[m], &b64) != nil {
				continue
			}
			if data, err := base64.StdEncoding.DecodeString(b64); err == nil {
				images = append(images, &mcp.ImageContent{Data: data, MIMEType: m})
			}
		}
	}
	return out, images
}

// CodeError is the exception the code raised.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback,omitempty"`
}

// NameInput names a variable.
type NameInput struct {
	Name string `json:"name" jsonschema:"name of a global variable of the interpreter"`
}

// VariableOutput is a variable's value.
type VariableOutput struct {
	Name string `json:"name"`
	Type string `json:"type"`
	JSON any    `json:"json,omitempty" jsonschema:"the value as JSON, when it serialises"`
	Repr string `json:"repr,omitempty" jsonschema:"the value's repr, when it does not serialise to JSON"`
}

// PathInput names a file or directory of the sandbox's workspace.
type PathInput struct {
	Path string `json:"path" jsonschema:"path relative to the sandbox's working directory"`
}

// WriteFileInput is the input of write_file.
type WriteFileInput struct {
	Path    string `json:"path" jsonschema:"path relative to the sandbox's working directory; parent directories are created"`
	Content string `json:"content" jsonschema:"the file's text"`
}

// FileOutput is a file's text.
type FileOutput struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

// ListOutput lists a directory.
type ListOutput struct {
	Entries []sessions.FileInfo `json:"entries"`
}

// Done says a tool did what it was asked.
type Done struct {
	OK bool `json:"ok"`
}

func (s *Server) addTools() {
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "run_code", Title: "Run Python",
		Description: "Run Python code in this session's sandbox. State (variables, imports, files) persists between calls. " +
			"Returns the last expression's value as result, stdout, stderr, and the exception if the code raised one. " +
			"Cancelling the call interrupts the code."}, inUse(s, s.runCode))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "get_variable", Title: "Read a variable",
		Description: "Read a global variable of the sandbox's interpreter: as JSON when it serialises, else its repr.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, inUse(s, s.getVariable))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "read_file", Title: "Read a file",
		Description: "Read a text file of the sandbox's workspace.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, inUse(s, s.readFile))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "write_file", Title: "Write a file",
		Description: "Write a text file into the sandbox's workspace, where the code can open it."}, inUse(s, s.writeFile))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "list_files", Title: "List files",
		Description: "List a directory of the sandbox's workspace (path \".\" for its root).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, inUse(s, s.listFiles))
	mcp.AddTool(s.mcp, &mcp.Tool{Name: "reset", Title: "Reset the interpreter",
		Description: "Start a fresh interpreter in the sandbox: every variable and import is gone; files stay.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptrTrue()}}, inUse(s, s.reset))
}

func ptrTrue() *bool { b := true; return &b }

func (s *Server) runCode(ctx context.Context, req *mcp.CallToolRequest, in RunCodeInput) (*mcp.CallToolResult, RunCodeOutput, error) {
	var err error
	exec := sessions.ExecRequest{Code: in.Code, TimeoutMillis: s.cfg.RunTimeout.Milliseconds()}
	if in.Context != nil {
		if exec.Context, err = json.Marshal(in.Context); err != nil {
			return nil, RunCodeOutput{}, fmt.Errorf("context: %w", err)
		}
	}
	if in.TimeoutSeconds > 0 {
		exec.TimeoutMillis = max(int64(in.TimeoutSeconds*1000), 1)
	}
	start := time.Now()
	var res *sessions.Result
	if !multiRoundTrip(req) {
		// The first run of the MCP session leases its sandbox in the same request.
		var ran bool
		if res, ran, err = s.runFirst(ctx, req, exec, sessions.Handlers{OnBridge: answerBridge(req)}); ran {
			return s.runCodeResult(res, err, start)
		}
	}
	ses, err := s.session(ctx, req)
	if err != nil {
		return nil, RunCodeOutput{}, err
	}
	l := s.leaseOf(req.Session)
	if l == nil {
		return nil, RunCodeOutput{}, errors.New("this MCP session has ended")
	}
	// One call at a time: a call that comes while a cancelled one still
	// stops its run waits for it instead of finding the sandbox busy.
	l.serial.Lock()
	if multiRoundTrip(req) {
		var round *mcp.CallToolResult
		round, res, err = s.runCodeRoundTrips(ctx, req, l, ses, exec)
		if round != nil { // the code asks the client's model: this round ends with the question
			l.serial.Unlock()
			return round, RunCodeOutput{}, nil
		}
	} else {
		res, err = ses.RunStream(ctx, exec, sessions.Handlers{OnBridge: answerBridge(req)})
	}
	l.serial.Unlock()
	return s.runCodeResult(res, err, start)
}

// runCodeResult is run_code's answer for a run's result.
func (s *Server) runCodeResult(res *sessions.Result, err error, start time.Time) (*mcp.CallToolResult, RunCodeOutput, error) {
	if err != nil {
		return nil, RunCodeOutput{}, toolError(err)
	}
	out := RunCodeOutput{Status: string(res.Status), Result: res.Result, Stdout: res.Stdout, Stderr: res.Stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated, DurationSeconds: res.DurationMillis / 1000}
	if out.DurationSeconds == 0 {
		out.DurationSeconds = time.Since(start).Seconds()
	}
	if res.Error != nil {
		out.Error = &CodeError{Name: res.Error.Type, Value: res.Error.Message, Traceback: res.Error.Traceback}
	}
	if res.StateLost {
		why := "it died"
		if out.Error != nil {
			why = out.Error.Name + ": " + out.Error.Value
		}
		return nil, out, fmt.Errorf("the sandbox's interpreter died (%s) and its state is gone: start a new MCP session", why)
	}
	var images []mcp.Content
	out.Results, images = richResults(res)
	for _, f := range res.Files {
		out.Files = append(out.Files, FileChange{Path: f.Path, Size: f.Size, Created: f.Created})
	}
	// A run whose code failed is a tool error the model sees, with the output it made.
	result := &mcp.CallToolResult{IsError: res.Status != sessions.StatusSucceeded}
	if len(images) > 0 {
		// Content of its own: the output as JSON text (what the SDK writes
		// when a tool sets none), then the images.
		text, err := json.Marshal(out)
		if err != nil {
			return nil, out, err
		}
		result.Content = append([]mcp.Content{&mcp.TextContent{Text: string(text)}}, images...)
	}
	return result, out, nil
}

func (s *Server) getVariable(ctx context.Context, req *mcp.CallToolRequest, in NameInput) (*mcp.CallToolResult, VariableOutput, error) {
	ses, err := s.session(ctx, req)
	if err != nil {
		return nil, VariableOutput{}, err
	}
	v, err := ses.Variable(ctx, in.Name)
	if err != nil {
		if sessions.IsStatus(err, 404) {
			return nil, VariableOutput{}, fmt.Errorf("no variable named %q in the sandbox", in.Name)
		}
		return nil, VariableOutput{}, toolError(err)
	}
	out := VariableOutput{Name: v.Name, Type: v.Type, Repr: v.Repr}
	if len(v.JSON) > 0 {
		// Numbers stay as the interpreter wrote them (no float64 rounding of big ints).
		d := json.NewDecoder(bytes.NewReader(v.JSON))
		d.UseNumber()
		if err := d.Decode(&out.JSON); err != nil {
			return nil, VariableOutput{}, fmt.Errorf("variable %s: unreadable JSON from the sandbox: %w", in.Name, err)
		}
	}
	return nil, out, nil
}

func (s *Server) readFile(ctx context.Context, req *mcp.CallToolRequest, in PathInput) (*mcp.CallToolResult, FileOutput, error) {
	ses, err := s.session(ctx, req)
	if err != nil {
		return nil, FileOutput{}, err
	}
	data, err := ses.ReadFile(ctx, in.Path)
	if err != nil {
		return nil, FileOutput{}, toolError(err)
	}
	return nil, FileOutput{Path: in.Path, Content: string(data)}, nil
}

func (s *Server) writeFile(ctx context.Context, req *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, Done, error) {
	ses, err := s.session(ctx, req)
	if err != nil {
		return nil, Done{}, err
	}
	if err := ses.WriteFile(ctx, in.Path, []byte(in.Content)); err != nil {
		return nil, Done{}, toolError(err)
	}
	return nil, Done{OK: true}, nil
}

func (s *Server) listFiles(ctx context.Context, req *mcp.CallToolRequest, in PathInput) (*mcp.CallToolResult, ListOutput, error) {
	ses, err := s.session(ctx, req)
	if err != nil {
		return nil, ListOutput{}, err
	}
	entries, err := ses.ListFiles(ctx, in.Path)
	if err != nil {
		return nil, ListOutput{}, toolError(err)
	}
	if entries == nil {
		entries = []sessions.FileInfo{}
	}
	return nil, ListOutput{Entries: entries}, nil
}

func (s *Server) reset(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, Done, error) {
	ses, err := s.session(ctx, req)
	if err != nil {
		return nil, Done{}, err
	}
	if err := ses.Reset(ctx); err != nil {
		return nil, Done{}, toolError(err)
	}
	return nil, Done{OK: true}, nil
}
