package flotilla_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// typedAPI is every name the typed API, its tests for users, its
// middleware and its traces added, by package directory: each has a
// runnable Example, and each exported name of flotillatest and otel does.
var typedAPI = map[string][]string{
	".": {
		"Args", "Job", "Job_Kind", "Job_FencingToken", "Job_Checkpoint", "Job_SaveProgress", "Job_Progress",
		"Job_DependencyResult", "Job_DependencyResults", "Job_Append", "Job_Metadata", "Job_Task",
		"Handle", "NewHandler", "ResultOf", "ErrNoResult", "WaitResult", "NewRequest", "NewStep",
		"SubmitArgs", "SubmitArgsTx", "SubmitArgsSQLiteTx",
		"Client_SubmitTx", "Client_SubmitSQLiteTx", "Client_SubmitPipelineTx", "Client_SubmitPipelineSQLiteTx",
		"Client_Wait", "Client_Report", "Client_Stop",
		"Migrate", "MigrateOption", "WithNumBuckets", "ErrNoSchema",
		"CommandOption", "Reason", "By",
		"ClientOption", "SubmitFunc", "SubmitMiddleware", "WithSubmitMiddleware",
		"SubmitOption", "WithKey", "WithPriority", "WithMaxAttempts", "WithRunAt", "WithDelay", "WithTimeout",
		"WithUniqueKey", "WithLimitKey", "WithResources", "WithMetadata",
	},
	"node":    {"Middleware", "Chain", "Recover", "PanicError", "LogAttempts", "LoggerFrom", "Node_RegisterSafely"},
	"metrics": {"Metrics_Middleware"},
	"kinds":   {"SleepPayload_Kind", "FailPayload_Kind", "ExecPayload_Kind"},
}

// whole lists the packages every exported name of which has an Example
// (constants aside: otel's attribute keys are shown by its examples).
var whole = []string{"flotillatest", "otel"}

func TestEveryNameOfTheTypedAPIHasAnExample(t *testing.T) {
	for _, dir := range whole {
		typedAPI[dir] = append(typedAPI[dir], exportedNames(t, dir)...)
	}
	for dir, names := range typedAPI {
		have := examplesIn(t, dir)
		for _, name := range names {
			if !have[name] {
				t.Errorf("%s: no Example%s", dir, name)
			}
		}
	}
}

// examplesIn names the Example functions of the package in dir, suffixes
// left out ("Handle" for ExampleHandle_strictPayload).
func examplesIn(t *testing.T, dir string) map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	for _, f := range goFiles(t, dir, true) {
		parsed, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, parsed)
	}
	have := map[string]bool{}
	for _, ex := range doc.Examples(files...) {
		have[ex.Name] = true
		// doc.Examples leaves the suffix in the name ("Handle_strictPayload"):
		// a last part that starts in lower case is one.
		if i := strings.LastIndex(ex.Name, "_"); i >= 0 && i+1 < len(ex.Name) && unicode.IsLower(rune(ex.Name[i+1])) {
			have[ex.Name[:i]] = true
		}
	}
	return have
}

// exportedNames lists the exported functions, types, variables and methods
// of the package in dir, as Example names spell them.
func exportedNames(t *testing.T, dir string) []string {
	t.Helper()
	fset := token.NewFileSet()
	var files []*ast.File
	for _, f := range goFiles(t, dir, false) {
		parsed, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, parsed)
	}
	p, err := doc.NewFromFiles(fset, files, "example.com/"+dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range p.Funcs {
		names = append(names, f.Name)
	}
	for _, v := range p.Vars {
		names = append(names, v.Names...)
	}
	for _, typ := range p.Types {
		names = append(names, typ.Name)
		for _, f := range typ.Funcs {
			names = append(names, f.Name)
		}
		for _, m := range typ.Methods {
			names = append(names, typ.Name+"_"+m.Name)
		}
	}
	sort.Strings(names)
	return names
}

func goFiles(t *testing.T, dir string, tests bool) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".go") && strings.HasSuffix(name, "_test.go") == tests {
			out = append(out, filepath.Join(dir, name))
		}
	}
	return out
}
