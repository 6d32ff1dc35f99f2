"""The protein side: FASTA/MSA input, model features, structure output and example inputs."""
