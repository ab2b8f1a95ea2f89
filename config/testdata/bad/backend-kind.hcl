backend "consul" {}
