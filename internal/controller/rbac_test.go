package controller_test

import (
	"os"
	"strings"
	"testing"

	"github.com/warmpool/warmpool/internal/controller"
)

// The data plane's role lets it update one Secret, its certificate's: the
// name in the role must be the one the data plane writes.
func TestDataPlaneRoleNamesItsCertificateSecret(t *testing.T) {
	role, err := os.ReadFile("../../config/dataplane/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(role), "- "+controller.DataPlaneCertSecret+"\n") {
		t.Fatalf("config/dataplane/role.yaml does not name %s in resourceNames: the data plane could not renew its certificate",
			controller.DataPlaneCertSecret)
	}
}
