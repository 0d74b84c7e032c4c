// Package deploy holds allot's deployment files (Dockerfile, compose.yaml,
// Kubernetes manifests) and a test that checks them against the binaries'
// configuration structs. It has no code of its own.
package deploy
