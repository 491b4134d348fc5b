package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/warmpool/warmpool/internal/version"
)

// versions is what `version` reports.
type versions struct {
	Client        version.Info `json:"clientVersion"`
	Kubernetes    string       `json:"kubernetesVersion,omitempty"`
	ManagerImages []string     `json:"managerImages,omitempty"`
}

func (p *plugin) versionCommand() *cobra.Command {
	var output string
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the plugin's version, the cluster's, and the manager's image",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "" && output != "json" && output != "yaml" {
				return usagef("--output is json or yaml, not %q", output)
			}
			v := versions{Client: version.Get()}
			var serverErr error
			if !clientOnly {
				serverErr = p.serverVersions(cmd, &v)
			}
			switch output {
			case "json":
				data, _ := json.MarshalIndent(v, "", "  ")
				fmt.Fprintln(p.streams.Out, string(data))
			case "yaml":
				data, _ := yaml.Marshal(v)
				fmt.Fprint(p.streams.Out, string(data))
			default:
				fmt.Fprintf(p.streams.Out, "Client Version: %s (commit %s, %s, %s)\n", v.Client.Version, v.Client.Commit, v.Client.GoVersion, v.Client.Platform)
				if v.Kubernetes != "" {
					fmt.Fprintf(p.streams.Out, "Kubernetes Version: %s\n", v.Kubernetes)
				}
				for _, img := range v.ManagerImages {
					fmt.Fprintf(p.streams.Out, "Manager Image: %s\n", img)
				}
			}
			// As kubectl version: the client's version, then why the
			// cluster's is missing, and exit 1.
			return serverErr
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or yaml")
	cmd.Flags().BoolVar(&clientOnly, "client", false, "the plugin's version only")
	return cmd
}

// serverVersions adds what the caller may see: the API server's version and
// the manager Deployment's image (tenants usually cannot read warmpool-system,
// which is no error). A kubeconfig or context that does not work, or a
// cluster that does not answer, is.
func (p *plugin) serverVersions(cmd *cobra.Command, v *versions) error {
	cfg, err := p.restConfig()
	if err != nil {
		return err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("discovery client: %w", err)
	}
	info, err := dc.ServerVersion()
	if err != nil {
		return fmt.Errorf("the cluster's version: %w", err)
	}
	v.Kubernetes = info.GitVersion
	c, err := p.client()
	if err != nil {
		return err
	}
	// The controllers and the data plane: one image, unless an upgrade is
	// half done.
	for _, name := range []string{"warmpool-controller-manager", "warmpool-data-plane"} {
		deploy := &appsv1.Deployment{}
		if err := c.Get(cmd.Context(), client.ObjectKey{Namespace: "warmpool-system", Name: name}, deploy); err != nil {
			continue
		}
		for _, ctr := range deploy.Spec.Template.Spec.Containers {
			if !slices.Contains(v.ManagerImages, ctr.Image) {
				v.ManagerImages = append(v.ManagerImages, ctr.Image)
			}
		}
	}
	return nil
}
