package kubectlplugin

import (
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/printers"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
)

// Output formats of the listing commands, as kubectl get's -o.
const (
	outputTable = ""
	outputWide  = "wide"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

func addOutputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", outputTable, "json, yaml or wide (more columns)")
}

func checkOutput(output string) error {
	switch output {
	case outputTable, outputWide, outputJSON, outputYAML:
		return nil
	}
	return usagef("--output is json, yaml or wide, not %q", output)
}

// printObject prints list as kubectl get -o json|yaml does: the List kind
// with every item's apiVersion and kind.
func (p *plugin) printObject(list runtime.Object, kind, output string) error {
	list.GetObjectKind().SetGroupVersionKind(sandboxv1alpha1.GroupVersion.WithKind(kind + "List"))
	// The typed client leaves the items' own apiVersion and kind empty.
	if err := meta.EachListItem(list, func(o runtime.Object) error {
		o.GetObjectKind().SetGroupVersionKind(sandboxv1alpha1.GroupVersion.WithKind(kind))
		return nil
	}); err != nil {
		return err
	}
	var pr printers.ResourcePrinter = &printers.JSONPrinter{}
	if output == outputYAML {
		pr = &printers.YAMLPrinter{}
	}
	return pr.PrintObj(list, p.streams.Out)
}
