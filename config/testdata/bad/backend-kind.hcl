backend "etcd" {}
