// Command agent is the entrypoint of a sandbox pod's container: it supervises
// a warm Python interpreter and serves the agent API. It is built out in the
// agent issue; until then it only reports that it is a placeholder.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "warmpool agent: not implemented yet")
	os.Exit(2)
}
