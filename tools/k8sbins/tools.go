//go:build tools

// Package tools records the Kubernetes commands this module builds, so that `go mod tidy`
// keeps their dependencies. It is never compiled.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
