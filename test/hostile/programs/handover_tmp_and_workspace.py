# Leaves files (hidden, read-only, in read-only directories, a symlink out)
# in the workspace and the temporary directory.
# status: succeeded
# handover: true
# e2e: true
# check: import os, tempfile
# check: left = os.listdir(".") + os.listdir(tempfile.gettempdir())
# check: "clean" if not left else f"left {left}"
import os, tempfile
for base in (".", tempfile.gettempdir()):
    os.makedirs(os.path.join(base, ".hidden/deep"), exist_ok=True)
    open(os.path.join(base, ".hidden/deep/secret"), "w").write("secret")
    os.chmod(os.path.join(base, ".hidden/deep"), 0o500)
    os.chmod(os.path.join(base, ".hidden"), 0)
    os.symlink("/etc", os.path.join(base, "etc-link"))
    open(os.path.join(base, "api_key.txt"), "w").write("sk-secret")
