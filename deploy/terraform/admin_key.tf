# Triton's admin key (triton_http/admin.py), as deploy/stack.yaml's TritonAdminKey: generated once per
# deployment, kept in Secrets Manager and injected by ECS into the containers that need it (main.tf), so the
# task definition never shows it; letters and digits only (it travels in Triton's command line and an HTTP
# header). Terraform keeps the value in its state, marked sensitive: keep the state in an encrypted backend.
resource "aws_secretsmanager_secret" "admin_key" {
  #checkov:skip=CKV_AWS_149:Secrets Manager always encrypts (aws/secretsmanager); who reads the key is the execution role's one statement
  #checkov:skip=CKV2_AWS_57:Triton reads the key at its start; a rotation is a new deployment of the service (docs/security.md)
  name_prefix = "${local.family}-triton-admin-key-"
  description = "Triton admin key of ${local.family}: opens Triton's repository, configuration, trace and logging APIs to the task's sidecars"
  tags        = var.tags
}

# Read at every plan; the version keeps the first value (ignore_changes), as the stack's generated secret does.
data "aws_secretsmanager_random_password" "admin_key" {
  password_length     = 48
  exclude_punctuation = true
  include_space       = false
}

resource "aws_secretsmanager_secret_version" "admin_key" {
  secret_id     = aws_secretsmanager_secret.admin_key.id
  secret_string = data.aws_secretsmanager_random_password.admin_key.random_password

  lifecycle {
    ignore_changes = [secret_string]
  }
}
