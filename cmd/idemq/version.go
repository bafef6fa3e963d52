package main

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/urfave/cli/v3"
)

// versionInfo says which idemq this is, from the build information Go
// embeds in every binary: what an operator pastes into a bug report.
type versionInfo struct {
	// Version is the module version: v1.2.3 for `go install ...@v1.2.3`,
	// (devel) for a build from a checkout.
	Version string `json:"version"`
	// Commit is the VCS revision of a build from a checkout, with
	// "+modified" when the tree had uncommitted changes; "unknown" when
	// the build recorded none (go install, or -buildvcs=false).
	Commit string `json:"commit"`
	Go     string `json:"go"`
}

func buildVersion() versionInfo {
	v := versionInfo{Version: "unknown", Commit: "unknown", Go: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Version, v.Go = bi.Main.Version, bi.GoVersion
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified {
		v.Commit += "+modified"
	}
	return v
}

func (v versionInfo) String() string {
	return fmt.Sprintf("%s (commit %s, %s)", v.Version, v.Commit, v.Go)
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name:  "version",
		Usage: "print the module version, commit and Go version of this binary",
		Action: func(_ context.Context, cmd *cli.Command) error {
			v := buildVersion()
			return output(cmd, v, func(t *table) { t.note("idemq %s", v) })
		},
	}
}
