//go:build e2e

package e2e

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/warmpool/warmpool/internal/testing/wrappers"
	"github.com/warmpool/warmpool/pkg/sessions"
)

// The data-science image under gVisor: a pool that preloads pandas, numpy
// and matplotlib, and a Session's rich results through the data plane.
var _ = Describe("rich results on the repl-data image", Ordered, Label("richresults"), func() {
	It("streams a DataFrame as HTML and a matplotlib chart as PNG where they come between the prints, and lists the files the run wrote", func() {
		ns := newNamespace()
		pool := wrappers.Pool(ns, "data").Replicas(1).Preload("pandas", "numpy", "matplotlib.pyplot").
			Timeout(60 * time.Second).Image(dataImage).Obj()
		Expect(k8s.Create(ctx, pool)).To(Succeed())
		waitWarm(pool)
		c, err := sessions.New(restConfig)
		Expect(err).NotTo(HaveOccurred())
		s, err := c.Create(ctx, ns, "rich-", "data", nil)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _ = s.Close(ctx) })

		var order []string
		res, err := s.RunStream(ctx, sessions.ExecRequest{Code: `
import pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({"k": [i % 3 for i in range(300)], "v": range(300)})
print("rows", len(df))
display(df.groupby("k").v.sum().to_frame())
plt.plot(df.v[:10], df.v[:10] ** 2)
plt.title("squares")
plt.savefig("chart.png")
print("saved")
`}, sessions.Handlers{
			OnStdout: func(d string) { order = append(order, "out:"+d) },
			OnDisplay: func(d sessions.Display) {
				kinds := []string{}
				for _, m := range []string{"text/html", "image/png"} {
					if _, ok := d.Data[m]; ok {
						kinds = append(kinds, m)
					}
				}
				order = append(order, "display:"+strings.Join(kinds, ","))
			},
		})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Status).To(Equal(sessions.StatusSucceeded), "%+v", res.Error)
		Expect(strings.Join(order, "|")).To(Equal("out:rows 300\n|display:text/html|out:saved\n|display:image/png"))
		Expect(res.Displays).To(HaveLen(2))
		var html, png string
		Expect(json.Unmarshal(res.Displays[0].Data["text/html"], &html)).To(Succeed())
		Expect(html).To(ContainSubstring("<table"))
		Expect(json.Unmarshal(res.Displays[1].Data["image/png"], &png)).To(Succeed())
		raw, err := base64.StdEncoding.DecodeString(png)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(raw[:8])).To(Equal("\x89PNG\r\n\x1a\n"))
		Expect(res.Files).To(HaveLen(1))
		Expect(res.Files[0].Path).To(Equal("chart.png"))
		Expect(res.Files[0].Created).To(BeTrue())
		Expect(res.Files[0].Size).To(BeNumerically(">", 1000))
	})
})
