module cos-auth-proxy/bench/go-signer

go 1.19
