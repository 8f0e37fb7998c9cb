package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
	yaml "go.yaml.in/yaml/v3"
)

// The deploy/ files run `worker run` with flags of their own; these tests
// hold them to what worker run accepts and to what a rolling deploy needs
// (docs/operations.md, "Scaling").

// k8sDoc is the part of a Kubernetes object the checks read.
type k8sDoc struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		MaxUnavailable any `yaml:"maxUnavailable"`
		Template       struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds int         `yaml:"terminationGracePeriodSeconds"`
				Containers                    []container `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

type container struct {
	Name  string   `yaml:"name"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env []struct {
		Name      string `yaml:"name"`
		ValueFrom struct {
			FieldRef struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
			SecretKeyRef struct {
				Name string `yaml:"name"`
			} `yaml:"secretKeyRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	ReadinessProbe struct {
		HTTPGet struct {
			Path string `yaml:"path"`
			Port any    `yaml:"port"`
		} `yaml:"httpGet"`
	} `yaml:"readinessProbe"`
}

func TestTheKubernetesDeploymentRunsABalancedFleet(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "deploy", "kubernetes", "flotilla.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	byKind := map[string]k8sDoc{}
	for {
		var d k8sDoc
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("deploy/kubernetes/flotilla.yaml: %v", err)
		}
		byKind[d.Kind] = d
	}
	dep, ok := byKind["Deployment"]
	if !ok || len(dep.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("no Deployment with one container: %+v", byKind)
	}
	c := dep.Spec.Template.Spec.Containers[0]
	flags := checkRunArgs(t, "the Deployment", c.Args)
	if flags["buckets"] != "all" || flags["node-id"] != "$(POD_NAME)" {
		t.Errorf("the pods run with --buckets %q --node-id %q, want all and $(POD_NAME)", flags["buckets"], flags["node-id"])
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.ValueFrom.FieldRef.FieldPath + e.ValueFrom.SecretKeyRef.Name
	}
	if env["POD_NAME"] != "metadata.name" || env[dsnEnv] == "" {
		t.Errorf("the container's environment %v lacks POD_NAME from metadata.name, or %s from a secret", env, dsnEnv)
	}
	if p := c.ReadinessProbe.HTTPGet; p.Path != "/readyz" || !strings.HasSuffix(flags["http"], ":8080") ||
		(p.Port != "http" && p.Port != 8080) || len(c.Ports) != 1 || c.Ports[0].ContainerPort != 8080 {
		t.Errorf("readiness probe %+v on ports %+v, with --http %q: want /readyz on the port --http serves",
			p, c.Ports, flags["http"])
	}
	grace := time.Duration(dep.Spec.Template.Spec.TerminationGracePeriodSeconds) * time.Second
	handoff, _ := time.ParseDuration(flags["handoff-timeout"])
	shutdown, _ := time.ParseDuration(flags["shutdown-timeout"])
	if handoff == 0 || grace <= handoff || grace <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %v is not above --handoff-timeout %v and --shutdown-timeout %v",
			grace, handoff, shutdown)
	}
	pdb, ok := byKind["PodDisruptionBudget"]
	if !ok || pdb.Spec.MaxUnavailable != 1 {
		t.Fatalf("no PodDisruptionBudget allowing one pod down: %+v", pdb)
	}
	for k, v := range dep.Spec.Template.Metadata.Labels {
		if pdb.Spec.Selector.MatchLabels[k] != v {
			t.Errorf("the PodDisruptionBudget's selector %v does not select the pods (%v)",
				pdb.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels)
		}
	}
}

func TestTheComposeFileRunsABalancedFleet(t *testing.T) {
	body, err := os.ReadFile(filepath.Join("..", "..", "deploy", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command         []string               `yaml:"command"`
			Environment     map[string]string      `yaml:"environment"`
			StopGracePeriod string                 `yaml:"stop_grace_period"`
			Deploy          struct{ Replicas int } `yaml:"deploy"`
		} `yaml:"services"`
	}
	if err := yaml.NewDecoder(bytes.NewReader(body)).Decode(&compose); err != nil {
		t.Fatalf("deploy/compose.yaml: %v", err)
	}
	w, ok := compose.Services["worker"]
	if !ok {
		t.Fatal("deploy/compose.yaml has no worker service")
	}
	flags := checkRunArgs(t, "the compose file", w.Command)
	if flags["buckets"] != "all" || w.Deploy.Replicas < 2 || w.Environment[dsnEnv] == "" {
		t.Errorf("the workers run %v, %d of them, with %s %q: want --buckets all, several, and a database",
			w.Command, w.Deploy.Replicas, dsnEnv, w.Environment[dsnEnv])
	}
	grace, err := time.ParseDuration(w.StopGracePeriod)
	handoff, _ := time.ParseDuration(flags["handoff-timeout"])
	if err != nil || handoff == 0 || grace <= handoff {
		t.Errorf("stop_grace_period %q is not above --handoff-timeout %v", w.StopGracePeriod, handoff)
	}
}

// checkRunArgs checks that args are `run` and flags worker run accepts,
// each flag with a value when it takes one, and returns the flags' values.
func checkRunArgs(t *testing.T, where string, args []string) map[string]string {
	t.Helper()
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("%s runs %v, want worker run", where, args)
	}
	known := map[string]cli.Flag{}
	for _, f := range runCommand().Flags {
		for _, name := range f.Names() {
			known[name] = f
		}
	}
	out := map[string]string{}
	for i := 1; i < len(args); i++ {
		name, value, inline := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		f, ok := known[name]
		if !strings.HasPrefix(args[i], "--") || !ok {
			t.Errorf("%s passes %q, which is not a flag of worker run", where, args[i])
			continue
		}
		if _, isBool := f.(*cli.BoolFlag); !isBool && !inline {
			if i+1 >= len(args) {
				t.Errorf("%s passes %s without a value", where, args[i])
				continue
			}
			i++
			value = args[i]
		}
		out[name] = value
	}
	// Parsing them as worker run would: every value must be one it takes.
	app := &cli.App{Name: "worker", Commands: []*cli.Command{{Name: "run", Flags: runCommand().Flags,
		Action: func(*cli.Context) error { return nil }}}, Writer: io.Discard, ErrWriter: io.Discard}
	if err := app.Run(append([]string{"worker"}, args...)); err != nil {
		t.Errorf("%s: worker run refuses %v: %v", where, args, err)
	}
	return out
}
