"""Model integrations: OpenFold's attention modules on Flashlight kernels, and a CPU compatibility layer."""
