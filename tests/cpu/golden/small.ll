; ModuleID = "small"
target triple = "unknown-unknown-unknown"
target datalayout = ""

define void @"small"(ptr %".1", ptr %".2", ptr %".3", i32 %".4")
{
entry:
  %".6" = alloca <4 x float>
  %".7" = alloca <4 x float>
  br label %"i.body"
i.body:
  %"i" = phi  i64 [0, %"entry"], [%".94", %"i.body"]
  store <4 x float> splat (float              0x0), ptr %".6"
  store <4 x float> splat (float              0x0), ptr %".7"
  %".11" = mul nsw i64 %"i", 2
  %".12" = getelementptr inbounds float, ptr %".1", i64 %".11"
  %".13" = load <4 x float>, ptr %".2", align 4
  %".14" = load float, ptr %".12", align 4
  %".15" = insertelement <4 x float> poison, float %".14", i32 0
  %".16" = shufflevector <4 x float> %".15", <4 x float> poison, <4 x i32> zeroinitializer
  %".17" = load <4 x float>, ptr %".6"
  %".18" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".16", <4 x float> %".13", <4 x float> %".17")
  store <4 x float> %".18", ptr %".6"
  %".20" = getelementptr inbounds float, ptr %".12", i64 1
  %".21" = load float, ptr %".20", align 4
  %".22" = insertelement <4 x float> poison, float %".21", i32 0
  %".23" = shufflevector <4 x float> %".22", <4 x float> poison, <4 x i32> zeroinitializer
  %".24" = load <4 x float>, ptr %".7"
  %".25" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".23", <4 x float> %".13", <4 x float> %".24")
  store <4 x float> %".25", ptr %".7"
  %".27" = getelementptr inbounds float, ptr %".12", i64 6
  %".28" = getelementptr inbounds float, ptr %".2", i64 4
  %".29" = load <4 x float>, ptr %".28", align 4
  %".30" = load float, ptr %".27", align 4
  %".31" = insertelement <4 x float> poison, float %".30", i32 0
  %".32" = shufflevector <4 x float> %".31", <4 x float> poison, <4 x i32> zeroinitializer
  %".33" = load <4 x float>, ptr %".6"
  %".34" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".32", <4 x float> %".29", <4 x float> %".33")
  store <4 x float> %".34", ptr %".6"
  %".36" = getelementptr inbounds float, ptr %".27", i64 1
  %".37" = load float, ptr %".36", align 4
  %".38" = insertelement <4 x float> poison, float %".37", i32 0
  %".39" = shufflevector <4 x float> %".38", <4 x float> poison, <4 x i32> zeroinitializer
  %".40" = load <4 x float>, ptr %".7"
  %".41" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".39", <4 x float> %".29", <4 x float> %".40")
  store <4 x float> %".41", ptr %".7"
  %".43" = mul nsw i64 %"i", 8
  %".44" = getelementptr inbounds float, ptr %".3", i64 %".43"
  %".45" = load <4 x float>, ptr %".6"
  %".46" = fsub <4 x float> splat (float              0x0), %".45"
  %".47" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".46", <4 x float> splat (float 0xc055d33340000000))
  %".48" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".47", <4 x float> splat (float 0x4056133340000000))
  %".49" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".48", <4 x float> splat (float 0x3ff7154760000000), <4 x float> splat (float 0x3fe0000000000000))
  %".50" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".49")
  %".51" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".50", <4 x float> splat (float 0xbfe6300000000000), <4 x float> %".48")
  %".52" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".50", <4 x float> splat (float 0x3f2bd01060000000), <4 x float> %".51")
  %".53" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> splat (float 0x3f2a0d2ce0000000), <4 x float> %".52", <4 x float> splat (float 0x3f56e879c0000000))
  %".54" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".53", <4 x float> %".52", <4 x float> splat (float 0x3f81112100000000))
  %".55" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".54", <4 x float> %".52", <4 x float> splat (float 0x3fa5553820000000))
  %".56" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".55", <4 x float> %".52", <4 x float> splat (float 0x3fc5555540000000))
  %".57" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".56", <4 x float> %".52", <4 x float> splat (float 0x3fe0000000000000))
  %".58" = fmul <4 x float> %".52", %".52"
  %".59" = fadd <4 x float> %".52", splat (float 0x3ff0000000000000)
  %".60" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".57", <4 x float> %".58", <4 x float> %".59")
  %".61" = fptosi <4 x float> %".50" to <4 x i32>
  %".62" = add <4 x i32> %".61", splat (i32 127)
  %".63" = shl <4 x i32> %".62", splat (i32 23)
  %".64" = bitcast <4 x i32> %".63" to <4 x float>
  %".65" = fmul <4 x float> %".60", %".64"
  %".66" = fadd <4 x float> splat (float 0x3ff0000000000000), %".65"
  %".67" = fdiv <4 x float> splat (float 0x3ff0000000000000), %".66"
  store <4 x float> %".67", ptr %".44", align 4
  %".69" = load <4 x float>, ptr %".7"
  %".70" = fsub <4 x float> splat (float              0x0), %".69"
  %".71" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".70", <4 x float> splat (float 0xc055d33340000000))
  %".72" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".71", <4 x float> splat (float 0x4056133340000000))
  %".73" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".72", <4 x float> splat (float 0x3ff7154760000000), <4 x float> splat (float 0x3fe0000000000000))
  %".74" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".73")
  %".75" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".74", <4 x float> splat (float 0xbfe6300000000000), <4 x float> %".72")
  %".76" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".74", <4 x float> splat (float 0x3f2bd01060000000), <4 x float> %".75")
  %".77" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> splat (float 0x3f2a0d2ce0000000), <4 x float> %".76", <4 x float> splat (float 0x3f56e879c0000000))
  %".78" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".77", <4 x float> %".76", <4 x float> splat (float 0x3f81112100000000))
  %".79" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".78", <4 x float> %".76", <4 x float> splat (float 0x3fa5553820000000))
  %".80" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".79", <4 x float> %".76", <4 x float> splat (float 0x3fc5555540000000))
  %".81" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".80", <4 x float> %".76", <4 x float> splat (float 0x3fe0000000000000))
  %".82" = fmul <4 x float> %".76", %".76"
  %".83" = fadd <4 x float> %".76", splat (float 0x3ff0000000000000)
  %".84" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".81", <4 x float> %".82", <4 x float> %".83")
  %".85" = fptosi <4 x float> %".74" to <4 x i32>
  %".86" = add <4 x i32> %".85", splat (i32 127)
  %".87" = shl <4 x i32> %".86", splat (i32 23)
  %".88" = bitcast <4 x i32> %".87" to <4 x float>
  %".89" = fmul <4 x float> %".84", %".88"
  %".90" = fadd <4 x float> splat (float 0x3ff0000000000000), %".89"
  %".91" = fdiv <4 x float> splat (float 0x3ff0000000000000), %".90"
  %".92" = getelementptr inbounds float, ptr %".44", i64 4
  store <4 x float> %".91", ptr %".92", align 4
  %".94" = add nsw nuw i64 %"i", 1
  %".95" = icmp slt i64 %".94", 3
  br i1 %".95", label %"i.body", label %"i.done"
i.done:
  ret void
}

declare <4 x float> @"llvm.fma.v4f32"(<4 x float> %".1", <4 x float> %".2", <4 x float> %".3")

declare <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.floor.v4f32"(<4 x float> %".1")
