// Command scriptedplane serves a scripted data plane (package scriptedplane)
// on a loopback port for the Python and TypeScript clients' recovery cases,
// and prints its URL on the first line of its output.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/warmpool/warmpool/internal/testing/scriptedplane"
)

func main() {
	ns := flag.String("namespace", "ns", "the Session's namespace")
	name := flag.String("session", "s", "the Session's name")
	flag.Parse()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("http://%s\n", l.Addr())
	_ = http.Serve(l, &scriptedplane.Plane{Namespace: *ns, Session: *name})
}
