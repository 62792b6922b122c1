module cos-kube-pause

go 1.22
