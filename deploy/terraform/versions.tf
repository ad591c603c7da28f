terraform {
  # templatefile/jsondecode/one() and variable validation; nothing newer is used.
  required_version = ">= 1.5.0"

  required_providers {
    aws = {
      source = "hashicorp/aws"
      # 6.0.0 added data.aws_region's `region` attribute (and deprecated `name`), which main.tf reads.
      version = ">= 6.0.0, < 7.0.0"
    }
  }
}
