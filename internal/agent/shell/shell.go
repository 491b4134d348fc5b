// Package shell runs a shell command for the agent, with output limits and a
// timeout that stops the command and everything it started.
package shell

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/warmpool/warmpool/internal/agent/output"
	"github.com/warmpool/warmpool/internal/agent/procs"
	"github.com/warmpool/warmpool/pkg/protocol"
)

// Options of one command.
type Options struct {
	Dir            string
	Env            []string
	Timeout        time.Duration
	Grace          time.Duration
	MaxOutputBytes int
	// OnStdout and OnStderr see output as it arrives.
	OnStdout, OnStderr func([]byte)
}

// Run runs command with /bin/sh -c. Cancelling ctx interrupts it like a timeout
// does: SIGINT to its process group, SIGKILL after the grace period.
func Run(ctx context.Context, command string, opts Options) (*protocol.ShellResult, error) {
	stdout, stderr := output.NewBuffer(opts.MaxOutputBytes), output.NewBuffer(opts.MaxOutputBytes)
	stdout.OnWrite, stderr.OnWrite = opts.OnStdout, opts.OnStderr
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Dir = opts.Dir
	cmd.Env = opts.Env
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	// A background process that keeps the pipes open must not hold the result.
	cmd.WaitDelay = time.Second
	start := time.Now()
	if err := procs.Start(cmd); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		procs.Done(cmd.Process.Pid)
		done <- err
	}()

	timer := time.NewTimer(opts.Timeout)
	defer timer.Stop()
	timedOut := false
	var err error
	var graceC <-chan time.Time
	stop := func() {
		if graceC == nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
			graceC = time.After(opts.Grace)
		}
	}
	ctxDone := ctx.Done()
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-timer.C:
			timedOut = true
			stop()
		case <-ctxDone:
			ctxDone = nil
			stop()
		case <-graceC:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}
	res := &protocol.ShellResult{
		Stdout: stdout.String("stdout"), Stderr: stderr.String("stderr"),
		StdoutTruncated: stdout.Truncated(), StderrTruncated: stderr.Truncated(),
		TimedOut:       timedOut,
		DurationMillis: float64(time.Since(start).Microseconds()) / 1000,
	}
	var exitErr *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.ExitCode = exitErr.ExitCode()
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ExitCode = 128 + int(ws.Signal())
		}
	case errors.Is(err, exec.ErrWaitDelay):
	default:
		return nil, err
	}
	return res, nil
}

// Env merges extra variables into the agent's environment.
func Env(extra map[string]string) []string {
	env := os.Environ()
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}
