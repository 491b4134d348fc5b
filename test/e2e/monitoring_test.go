//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	sandboxv1alpha1 "github.com/warmpool/warmpool/api/v1alpha1"
	"github.com/warmpool/warmpool/internal/monitoring"
	"github.com/warmpool/warmpool/internal/testing/wrappers"
)

// A real Prometheus, run on this machine as a user would run it in the
// cluster: it finds the manager through the metrics Service's endpoints,
// scrapes /metrics over HTTPS with a service account bound to
// warmpool-metrics-reader, and loads config/prometheus's alerts. Every
// dashboard query must run, and the alerts must see a pool that cannot start.
var _ = Describe("monitoring", Ordered, Label("monitoring"), func() {
	var prom string // base URL
	var ns string

	BeforeAll(func() {
		binary := os.Getenv("PROMETHEUS")
		Expect(binary).NotTo(BeEmpty(), "PROMETHEUS names the prometheus binary (make test-e2e builds it)")
		ns = newNamespace()

		By("a service account allowed to read /metrics, and its token")
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "prometheus"}}
		Expect(k8s.Create(ctx, sa)).To(Succeed())
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-prometheus"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "warmpool-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "prometheus"}},
		}
		Expect(k8s.Create(ctx, crb)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(ctx, crb) })
		dir := GinkgoT().TempDir()
		token := filepath.Join(dir, "token")
		Expect(os.WriteFile(token, []byte(strings.TrimSpace(run(kubectl(), "-n", ns, "create", "token", "prometheus", "--duration=2h"))), 0o600)).To(Succeed())

		By("Prometheus with the shipped alerts, scraping the manager every 2 s")
		rules, err := monitoring.LoadPrometheusRule(filepath.Join(repoRoot(), "config", "prometheus", "rules.yaml"))
		Expect(err).NotTo(HaveOccurred())
		writeYAMLFile(filepath.Join(dir, "warmpool.rules.yaml"), rules)
		kubeconfig, err := filepath.Abs(os.Getenv("KUBECONFIG"))
		Expect(err).NotTo(HaveOccurred())
		writeYAMLFile(filepath.Join(dir, "prometheus.yml"), map[string]any{
			"global":     map[string]any{"scrape_interval": "2s", "evaluation_interval": "2s"},
			"rule_files": []string{"warmpool.rules.yaml"},
			"scrape_configs": []any{map[string]any{
				"job_name": "warmpool",
				"kubernetes_sd_configs": []any{map[string]any{
					"role": "endpoints", "kubeconfig_file": kubeconfig,
					"namespaces": map[string]any{"names": []string{"warmpool-system"}},
				}},
				"relabel_configs": []any{
					map[string]any{"source_labels": []string{"__meta_kubernetes_service_name", "__meta_kubernetes_endpoint_port_name"},
						"regex": "warmpool-controller-manager-metrics-service;https", "action": "keep"},
					map[string]any{"source_labels": []string{"__meta_kubernetes_pod_name"}, "target_label": "pod"},
				},
				"scheme":        "https",
				"authorization": map[string]any{"credentials_file": token},
				"tls_config":    map[string]any{"insecure_skip_verify": true},
			}},
		})
		port := freePort()
		prom = fmt.Sprintf("http://127.0.0.1:%d", port)
		cmd := exec.Command(binary, "--config.file="+filepath.Join(dir, "prometheus.yml"),
			"--storage.tsdb.path="+filepath.Join(dir, "data"), fmt.Sprintf("--web.listen-address=127.0.0.1:%d", port))
		cmd.Dir = dir
		logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
		Expect(err).NotTo(HaveOccurred())
		cmd.Stdout, cmd.Stderr = logFile, logFile
		Expect(cmd.Start()).To(Succeed())
		DeferCleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if CurrentSpecReport().Failed() {
				out, _ := os.ReadFile(logFile.Name())
				lines := strings.Split(string(out), "\n")
				fmt.Fprintf(GinkgoWriter, "prometheus log (last 30 lines):\n%s\n", strings.Join(lines[max(0, len(lines)-30):], "\n"))
			}
		})

		By("the manager's target is up")
		Eventually(func(g Gomega) {
			var targets struct {
				ActiveTargets []struct {
					Health    string `json:"health"`
					LastError string `json:"lastError"`
					ScrapeURL string `json:"scrapeUrl"`
				} `json:"activeTargets"`
			}
			g.Expect(promAPI(prom, "/api/v1/targets", nil, &targets)).To(Succeed())
			g.Expect(targets.ActiveTargets).NotTo(BeEmpty(), "no target found through the Service's endpoints")
			for _, t := range targets.ActiveTargets {
				g.Expect(t.Health).To(Equal("up"), "%s: %s", t.ScrapeURL, t.LastError)
			}
		}).WithTimeout(90 * time.Second).Should(Succeed())
	})

	It("answers every dashboard query, and the alerts see a pool that cannot start", func() {
		By("work for the metrics: a warm pool, Executions that succeed, fail and time out, and a pool whose image does not exist")
		warmPool(wrappers.Pool(ns, "python").Replicas(1))
		for i, tc := range []struct {
			code string
			want sandboxv1alpha1.ExecutionPhase
		}{
			{"print('ok')", sandboxv1alpha1.PhaseSucceeded},
			{"1/0", sandboxv1alpha1.PhaseFailed},
			{"while True: pass", sandboxv1alpha1.PhaseTimedOut},
		} {
			ex := wrappers.Execution(ns, fmt.Sprintf("m-%d", i)).Code(tc.code).Timeout(2 * time.Second).Obj()
			Expect(execute(ex).Status.Phase).To(Equal(tc.want))
		}
		broken := wrappers.Pool(ns, "broken").Replicas(1).Image("registry.invalid/warmpool/none:1").Obj()
		Expect(k8s.Create(ctx, broken)).To(Succeed())
		Expect(k8s.Create(ctx, wrappers.Execution(ns, "waits").Pool("broken").Code("1").Obj())).To(Succeed())

		By("the pool's Degraded condition reaches Prometheus, and WarmpoolPoolDegraded is pending for it")
		Eventually(func(g Gomega) {
			var rules struct {
				Groups []struct {
					Rules []struct {
						Name   string `json:"name"`
						Health string `json:"health"`
						Error  string `json:"lastError"`
						Alerts []struct {
							Labels map[string]string `json:"labels"`
							State  string            `json:"state"`
						} `json:"alerts"`
					} `json:"rules"`
				} `json:"groups"`
			}
			g.Expect(promAPI(prom, "/api/v1/rules", nil, &rules)).To(Succeed())
			g.Expect(rules.Groups).NotTo(BeEmpty())
			var degraded []string
			for _, r := range rules.Groups[0].Rules {
				g.Expect(r.Health).NotTo(Equal("err"), "%s: %s", r.Name, r.Error)
				if r.Name != "WarmpoolPoolDegraded" {
					continue
				}
				for _, a := range r.Alerts {
					degraded = append(degraded, a.Labels["namespace"]+"/"+a.Labels["pool"]+" "+a.State)
				}
			}
			g.Expect(degraded).To(ContainElement(ns + "/broken pending"))
		}).WithTimeout(3 * time.Minute).Should(Succeed())

		By("the alerts' expressions without their 'for' find the broken pool's starting pod and waiting Execution")
		for _, expr := range []string{
			fmt.Sprintf(`time() - warmpool_pool_oldest_warming_pod_created_timestamp_seconds{namespace=%q, pool="broken"} > 0`, ns),
			fmt.Sprintf(`time() - warmpool_pool_oldest_pending_created_timestamp_seconds{namespace=%q, pool="broken"} > 0`, ns),
		} {
			Eventually(func() (int, error) { return resultCount(prom, expr) }).WithTimeout(time.Minute).Should(Equal(1), expr)
		}

		By("every dashboard query and variable runs, and the core panels have data")
		d, err := monitoring.LoadDashboard(filepath.Join(repoRoot(), "config", "grafana", "warmpool.json"))
		Expect(err).NotTo(HaveOccurred())
		for _, q := range d.Queries {
			expr, err := monitoring.Expand(q.Expr, "1m")
			Expect(err).NotTo(HaveOccurred())
			_, err = resultCount(prom, expr)
			Expect(err).NotTo(HaveOccurred(), "panel %q: %s", q.Panel, expr)
		}
		for _, expr := range []string{
			`count(warmpool_build_info)`,
			fmt.Sprintf(`sum by (state) (warmpool_pool_pods{namespace=%q})`, ns),
			`sum by (phase) (increase(warmpool_executions_total[10m])) > 0`,
			`sum by (cause) (increase(warmpool_execution_interrupts_total{cause="timeout"}[10m])) > 0`,
			fmt.Sprintf(`warmpool_pool_warm_hit_ratio{namespace=%q, pool="python"}`, ns),
			`histogram_quantile(0.99, sum by (le) (rate(warmpool_execution_queue_wait_seconds_bucket[10m])))`,
		} {
			Eventually(func() (int, error) { return resultCount(prom, expr) }).WithTimeout(time.Minute).Should(BeNumerically(">", 0), expr)
		}

		// For docs/monitoring.md's picture (not in CI): minutes of mixed
		// traffic, then the panels drawn from Prometheus' answers.
		if out := os.Getenv("E2E_MONITORING_PLOT"); out != "" {
			load, err := time.ParseDuration(envOr("E2E_MONITORING_LOAD", "5m"))
			Expect(err).NotTo(HaveOccurred())
			By(fmt.Sprintf("%s of traffic: about one Execution a second, some failing or timing out, and Sessions", load))
			pool := &sandboxv1alpha1.SandboxPool{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "python"}, pool)).To(Succeed())
			pool.Spec.Replicas = 3
			Expect(k8s.Update(ctx, pool)).To(Succeed())
			start := time.Now()
			for i := 0; time.Since(start) < load; i++ {
				code := "sum(range(100000))"
				switch {
				case i%20 == 7:
					code = "while True: pass"
				case i%10 == 3:
					code = "{}['missing']"
				}
				Expect(k8s.Create(ctx, wrappers.Execution(ns, fmt.Sprintf("load-%d", i)).Code(code).Timeout(time.Second).Obj())).To(Succeed())
				if i%30 == 0 {
					Expect(k8s.Create(ctx, wrappers.Session(ns, fmt.Sprintf("nb-%d", i)).Pool("python").IdleTimeout(20*time.Second).Obj())).To(Succeed())
				}
				// Bursts every other minute: four at once.
				if int(time.Since(start).Minutes())%2 == 1 && i%4 != 0 {
					continue
				}
				time.Sleep(time.Second)
			}
			time.Sleep(30 * time.Second)
			By("drawing the dashboard's panels from Prometheus into " + out)
			run("go", "-C", repoRoot(), "run", "./hack/monitoring", "plot", "-prometheus", prom, "-out", out,
				"-window", (load + time.Minute).String())
		}
	})
})

func freePort() int {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func writeYAMLFile(path string, v any) {
	GinkgoHelper()
	data, err := yaml.Marshal(v)
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(path, data, 0o644)).To(Succeed())
}

// promAPI GETs a Prometheus API path and decodes its data field into out.
func promAPI(base, path string, q url.Values, out any) error {
	resp, err := http.Get(base + path + "?" + q.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s", path, body.Error)
	}
	return json.Unmarshal(body.Data, out)
}

// resultCount runs an instant query and counts the series it returns.
func resultCount(base, expr string) (int, error) {
	var data struct {
		Result []json.RawMessage `json:"result"`
	}
	if err := promAPI(base, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return 0, err
	}
	return len(data.Result), nil
}
