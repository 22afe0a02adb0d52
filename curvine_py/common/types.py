"""Constants shared by the master, the client and the mount."""
from __future__ import annotations

ROOT_INO = 1
NAME_MAX = 255
PATH_MAX = 4096
DIR_SIZE = 4096          # st_size reported for directories, as ext4 does

# SetAttrRequest.valid bits
SETATTR_MODE = 1 << 0
SETATTR_UID = 1 << 1
SETATTR_GID = 1 << 2
SETATTR_SIZE = 1 << 3
SETATTR_ATIME = 1 << 4
SETATTR_MTIME = 1 << 5
SETATTR_ATIME_NOW = 1 << 6
SETATTR_MTIME_NOW = 1 << 7

# RenameRequest.flags (same values as the Linux renameat2 flags)
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2

# XattrRequest.flags (same values as Linux setxattr)
XATTR_CREATE = 1
XATTR_REPLACE = 2

# A file unlinked while a mount still has it open keeps living under this name prefix
# until the last handle is released (as libfuse's .fuse_hidden files); listings skip it.
HIDDEN_PREFIX = ".curvine_hidden_"
# A file's capabilities: the kernel asks for it before each write(2) and drops it at a
# write by someone without CAP_FSETID (killpriv), asking as that writer.
CAPABILITY_XATTR = "security.capability"
