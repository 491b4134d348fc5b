package kubectlplugin

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warmpool/warmpool/pkg/sessions"
	"github.com/warmpool/warmpool/pkg/snapshot"
)

// Snapshots of Sessions: their bytes pass through here to a file and back,
// and only their JSON manifest is read; a snapshot is unpickled only in a
// sandbox.

func (p *plugin) snapshotCommand() *cobra.Command {
	var file string
	var workspace bool
	cmd := &cobra.Command{
		Use:   "snapshot NAME",
		Short: "Save a Session's state (variables, functions, classes, imported modules; --workspace: files) to a file",
		Example: `  kubectl warmpool sessions snapshot nb -o nb.wpsnap --workspace
  kubectl warmpool sessions restore other -f nb.wpsnap`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			s, err := p.session(a[0])
			if err != nil {
				return err
			}
			body, err := s.Snapshot(cmd.Context(), workspace)
			if err != nil {
				return fmt.Errorf("snapshot of Session %s: %w", a[0], err)
			}
			defer func() { _ = body.Close() }()
			data, err := io.ReadAll(body)
			if err != nil {
				return fmt.Errorf("read the snapshot of Session %s: %w", a[0], err)
			}
			m, err := snapshot.ReadHeader(bytes.NewReader(data))
			if err != nil {
				return err
			}
			if file == "" {
				file = a[0] + ".wpsnap"
			}
			if err := os.WriteFile(file, data, 0o600); err != nil {
				return err
			}
			fmt.Fprintf(p.streams.Out, "%s: %d bytes, Python %s, %d variables%s\n", file, len(data), m.Python, len(m.Variables), workspaceSummary(m))
			p.warnSkipped(m)
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "output", "o", "", "file to write (default NAME.wpsnap)")
	cmd.Flags().BoolVar(&workspace, "workspace", false, "include the workspace's files")
	return cmd
}

func (p *plugin) restoreCommand() *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "restore NAME -f FILE",
		Short: "Replace a Ready Session's state with a snapshot's (names made since are gone)",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			if file == "" {
				return usagef("-f FILE is required: a snapshot from kubectl warmpool sessions snapshot")
			}
			data, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			if _, err := snapshot.ReadHeader(bytes.NewReader(data)); err != nil {
				return usagef("%s: %v", file, err)
			}
			s, err := p.session(a[0])
			if err != nil {
				return err
			}
			res, err := s.Restore(cmd.Context(), bytes.NewReader(data))
			if err != nil {
				return fmt.Errorf("restore Session %s: %w", a[0], err)
			}
			fmt.Fprintf(p.streams.Out, "session.sandbox.warmpool.dev/%s restored: %d variables", a[0], res.Variables)
			if res.WorkspaceFiles > 0 {
				fmt.Fprintf(p.streams.Out, ", %d workspace files", res.WorkspaceFiles)
			}
			fmt.Fprintln(p.streams.Out)
			for alias, why := range res.ModulesFailed {
				fmt.Fprintf(p.streams.ErrOut, "warning: module %s did not import here: %s\n", alias, why)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "filename", "f", "", "the snapshot file")
	return cmd
}

func (p *plugin) forkCommand() *cobra.Command {
	var count int
	var names []string
	var workspace bool
	cmd := &cobra.Command{
		Use:   "fork NAME",
		Short: "Copy a Session into new ones, on the server; each goes on alone",
		Example: `  kubectl warmpool sessions fork nb --count 3
  kubectl warmpool sessions fork nb --name try-a --name try-b --workspace`,
		Args: args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			s, err := p.session(a[0])
			if err != nil {
				return err
			}
			req := sessions.ForkRequest{Names: names, Workspace: workspace}
			if len(names) == 0 {
				req.Count = count
			}
			res, err := s.Fork(cmd.Context(), req)
			if err != nil {
				return fmt.Errorf("fork Session %s: %w", a[0], err)
			}
			for _, n := range res.Sessions {
				fmt.Fprintf(p.streams.Out, "session.sandbox.warmpool.dev/%s forked from %s\n", n, a[0])
			}
			if res.Manifest != nil {
				p.warnSkipped(res.Manifest)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&count, "count", 1, "how many forks")
	cmd.Flags().StringArrayVar(&names, "name", nil, "name of a fork (repeat for more; instead of --count)")
	cmd.Flags().BoolVar(&workspace, "workspace", false, "copy the workspace's files too")
	return cmd
}

// session is a data-plane handle on the named Session of the namespace.
func (p *plugin) session(name string) (*sessions.Session, error) {
	cfg, err := p.restConfig()
	if err != nil {
		return nil, err
	}
	ns, err := p.namespace()
	if err != nil {
		return nil, err
	}
	sc, err := sessions.New(cfg)
	if err != nil {
		return nil, err
	}
	return sc.Open(ns, name), nil
}

func (p *plugin) warnSkipped(m *snapshot.Manifest) {
	if len(m.Skipped) == 0 {
		return
	}
	var parts []string
	for _, s := range m.Skipped {
		parts = append(parts, fmt.Sprintf("%s (%s)", s.Name, s.Reason))
	}
	fmt.Fprintf(p.streams.ErrOut, "warning: not saved (they cannot be serialised): %s\n", strings.Join(parts, "; "))
}

func workspaceSummary(m *snapshot.Manifest) string {
	if m.Workspace == nil {
		return ""
	}
	return fmt.Sprintf(", %d workspace files (%d bytes)", m.Workspace.Files, m.Workspace.Bytes)
}
