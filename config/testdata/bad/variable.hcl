state_dir = var.dir
