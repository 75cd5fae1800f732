module github.com/agentbox/agentbox/hack/k8s/pause

go 1.26.8
