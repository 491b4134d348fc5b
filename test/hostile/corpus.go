// Package hostile is the corpus of hostile programs the agent must hold
// against (docs/security.md, "The agent supervises code it does not trust"):
// code that attacks the agent's own plumbing, each program with the status it
// must end in, how fast, whether the state is lost, what the next run finds,
// and, for a hand-over, what the next user finds. hostile_test.go runs all of
// them against the real agent and python3, as a sandbox (PID 1 of its own
// namespaces, non-root, as in a pod) and as the laptop daemon; the e2e suite
// runs those marked e2e under gVisor.
//
// Each program is a Python file in programs/ whose leading comment lines
// are its description and its expectations, "# key: value":
//
//	status        how the run ends (succeeded, failed, timed_out, interrupted)
//	status.C      the same where the agent's containment is C ("namespaces",
//	              "process-tree"), when the two differ
//	stateLost     whether the run reports its state lost (default false)
//	error         the run's error type
//	reason        a part of the run's stateLostReason
//	stdout        the run's exact stdout; stdout-has: a part of it
//	result        the run's result (a repr)
//	timeout       the run's timeout (default 2s); grace: its grace (default 1s)
//	within        how long the run may take (default timeout + grace + 1s)
//	pause         how long to wait before the next run (default 0)
//	next-stateLost, next-reason   what the next run reports (default: nothing lost)
//	next-code, next-status, next-timeout   the next run, when not the default
//	              check that the state is there exactly when nothing was lost
//	handover      true: the sandbox passes to another user after the run
//	              (a reset with wipe), and check runs as that user
//	check         Python whose value must be 'clean' (one "# check:" line per
//	              line of code)
//	api-read      a workspace path whose read and write through the file API
//	              must be refused at once (4xx), not wait for the code
//	language      shell: the program is a shell command
//	modes         sandbox or daemon: run only as that (default both)
//	containment   run only where the agent's containment is this
//	e2e           true: in the subset the e2e suite runs under gVisor
package hostile

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/warmpool/warmpool/pkg/protocol"
)

//go:embed programs/*
var programs embed.FS

// Program is one hostile program and what it must end in.
type Program struct {
	Name, Description, Code, Language string

	Status          protocol.Status
	StatusIn        map[string]protocol.Status // by containment
	StateLost       bool
	ErrorType       string
	Reason          string
	Stdout          *string
	StdoutHas       string
	Result          *string
	Timeout, Grace  time.Duration
	Within          time.Duration
	Pause           time.Duration
	NextStateLost   bool
	NextReason      string
	NextCode        string
	NextStatus      protocol.Status
	NextTimeout     time.Duration
	HandOver        bool
	Check           string
	APIRead         string
	Modes           []string
	Containment     string
	E2E             bool
	declaredWithin  bool
	declaredTimeout bool
}

// Mode names how the agent runs.
const (
	ModeSandbox = "sandbox"
	ModeDaemon  = "daemon"
)

// WantStatus is the status the program must end in under containment c.
func (p *Program) WantStatus(c string) protocol.Status {
	if s, ok := p.StatusIn[c]; ok {
		return s
	}
	return p.Status
}

// RunsIn says whether the program runs in mode under containment c.
func (p *Program) RunsIn(mode, c string) bool {
	if len(p.Modes) > 0 && !slices.Contains(p.Modes, mode) {
		return false
	}
	return p.Containment == "" || p.Containment == c
}

// Request is the program's execute request.
func (p *Program) Request(id string) protocol.ExecuteRequest {
	req := protocol.ExecuteRequest{ID: id, Code: p.Code, TimeoutMillis: p.Timeout.Milliseconds(), GraceMillis: p.Grace.Milliseconds()}
	if p.Language == protocol.LanguageShell {
		req.Language = protocol.LanguageShell
	}
	return req
}

// Corpus returns every program, by name.
func Corpus() ([]*Program, error) {
	entries, err := fs.ReadDir(programs, "programs")
	if err != nil {
		return nil, err
	}
	var out []*Program
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".py") && !strings.HasSuffix(e.Name(), ".sh") {
			continue
		}
		b, err := programs.ReadFile(path.Join("programs", e.Name()))
		if err != nil {
			return nil, err
		}
		p, err := parse(strings.TrimSuffix(strings.TrimSuffix(e.Name(), ".py"), ".sh"), string(b))
		if err != nil {
			return nil, fmt.Errorf("programs/%s: %w", e.Name(), err)
		}
		if strings.HasSuffix(e.Name(), ".sh") {
			p.Language = protocol.LanguageShell
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

var known = map[string]bool{}

func init() {
	for _, k := range strings.Fields(`status stateLost error reason stdout stdout-has result timeout grace within pause
		next-stateLost next-reason next-code next-status next-timeout handover check api-read language modes containment e2e`) {
		known[k] = true
	}
}

func parse(name, src string) (*Program, error) {
	p := &Program{Name: name, Code: src, Timeout: 2 * time.Second, Grace: time.Second, StatusIn: map[string]protocol.Status{}}
	var desc, check []string
	keys := false // the description comes first; after it, every line is a key
	for _, line := range strings.Split(src, "\n") {
		if !strings.HasPrefix(line, "#") {
			break
		}
		text := strings.TrimSpace(strings.TrimPrefix(line, "#"))
		key, val, ok := strings.Cut(text, ":")
		if !keys && (!ok || strings.ContainsAny(key, " \t") || !known[strings.SplitN(key, ".", 2)[0]]) {
			desc = append(desc, text)
			continue
		}
		keys = true
		val = strings.TrimSpace(val)
		var err error
		switch {
		case key == "status":
			p.Status = protocol.Status(val)
		case strings.HasPrefix(key, "status."):
			p.StatusIn[strings.TrimPrefix(key, "status.")] = protocol.Status(val)
		case key == "stateLost":
			p.StateLost, err = strconv.ParseBool(val)
		case key == "error":
			p.ErrorType = val
		case key == "reason":
			p.Reason = val
		case key == "stdout":
			v, uerr := strconv.Unquote(val)
			p.Stdout, err = &v, uerr
		case key == "stdout-has":
			p.StdoutHas = val
		case key == "result":
			p.Result = &val
		case key == "timeout":
			p.Timeout, err = time.ParseDuration(val)
			p.declaredTimeout = true
		case key == "grace":
			p.Grace, err = time.ParseDuration(val)
		case key == "within":
			p.Within, err = time.ParseDuration(val)
			p.declaredWithin = true
		case key == "pause":
			p.Pause, err = time.ParseDuration(val)
		case key == "next-stateLost":
			p.NextStateLost, err = strconv.ParseBool(val)
		case key == "next-reason":
			p.NextReason = val
		case key == "next-code":
			p.NextCode = val
		case key == "next-status":
			p.NextStatus = protocol.Status(val)
		case key == "next-timeout":
			p.NextTimeout, err = time.ParseDuration(val)
		case key == "handover":
			p.HandOver, err = strconv.ParseBool(val)
		case key == "check": // one line of Python each, indentation kept
			check = append(check, strings.TrimPrefix(line, "# check: "))
		case key == "api-read":
			p.APIRead = val
		case key == "modes":
			p.Modes = strings.Fields(strings.ReplaceAll(val, ",", " "))
		case key == "containment":
			p.Containment = val
		case key == "e2e":
			p.E2E, err = strconv.ParseBool(val)
		case key == "language":
			p.Language = val
		default:
			return nil, fmt.Errorf("unknown key %q", key)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
	}
	p.Description = strings.Join(desc, " ")
	p.Check = strings.Join(check, "\n")
	switch {
	case p.Status == "":
		return nil, fmt.Errorf("no status")
	case p.Description == "":
		return nil, fmt.Errorf("no description")
	case p.HandOver && p.Check == "":
		return nil, fmt.Errorf("a hand-over needs a check")
	}
	if !p.declaredWithin {
		p.Within = p.Timeout + p.Grace + time.Second
	}
	return p, nil
}
