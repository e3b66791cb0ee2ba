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
  %"i" = phi  i64 [0, %"entry"], [%".96", %"i.body"]
  store <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".6"
  store <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, ptr %".7"
  %".11" = mul nsw i64 %"i", 2
  %".12" = getelementptr inbounds float, ptr %".1", i64 %".11"
  %".13" = load <4 x float>, ptr %".2", align 4
  %".14" = load float, ptr %".12", align 4
  %".15" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".14", i32 0
  %".16" = shufflevector <4 x float> %".15", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".17" = load <4 x float>, ptr %".6"
  %".18" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".16", <4 x float> %".13", <4 x float> %".17")
  store <4 x float> %".18", ptr %".6"
  %".20" = getelementptr inbounds float, ptr %".12", i64 1
  %".21" = load float, ptr %".20", align 4
  %".22" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".21", i32 0
  %".23" = shufflevector <4 x float> %".22", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".24" = load <4 x float>, ptr %".7"
  %".25" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".23", <4 x float> %".13", <4 x float> %".24")
  store <4 x float> %".25", ptr %".7"
  %".27" = mul nsw i64 %"i", 2
  %".28" = add nsw i64 %".27", 6
  %".29" = getelementptr inbounds float, ptr %".1", i64 %".28"
  %".30" = getelementptr inbounds float, ptr %".2", i64 4
  %".31" = load <4 x float>, ptr %".30", align 4
  %".32" = load float, ptr %".29", align 4
  %".33" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".32", i32 0
  %".34" = shufflevector <4 x float> %".33", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".35" = load <4 x float>, ptr %".6"
  %".36" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".34", <4 x float> %".31", <4 x float> %".35")
  store <4 x float> %".36", ptr %".6"
  %".38" = getelementptr inbounds float, ptr %".29", i64 1
  %".39" = load float, ptr %".38", align 4
  %".40" = insertelement <4 x float> <float undef, float undef, float undef, float undef>, float %".39", i32 0
  %".41" = shufflevector <4 x float> %".40", <4 x float> <float undef, float undef, float undef, float undef>, <4 x i32> <i32 0, i32 0, i32 0, i32 0>
  %".42" = load <4 x float>, ptr %".7"
  %".43" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".41", <4 x float> %".31", <4 x float> %".42")
  store <4 x float> %".43", ptr %".7"
  %".45" = mul nsw i64 %"i", 8
  %".46" = getelementptr inbounds float, ptr %".3", i64 %".45"
  %".47" = load <4 x float>, ptr %".6"
  %".48" = fsub <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, %".47"
  %".49" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".48", <4 x float> <float 0xc055d33340000000, float 0xc055d33340000000, float 0xc055d33340000000, float 0xc055d33340000000>)
  %".50" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".49", <4 x float> <float 0x4056133340000000, float 0x4056133340000000, float 0x4056133340000000, float 0x4056133340000000>)
  %".51" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".50", <4 x float> <float 0x3ff7154760000000, float 0x3ff7154760000000, float 0x3ff7154760000000, float 0x3ff7154760000000>, <4 x float> <float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000>)
  %".52" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".51")
  %".53" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".52", <4 x float> <float 0xbfe6300000000000, float 0xbfe6300000000000, float 0xbfe6300000000000, float 0xbfe6300000000000>, <4 x float> %".50")
  %".54" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".52", <4 x float> <float 0x3f2bd01060000000, float 0x3f2bd01060000000, float 0x3f2bd01060000000, float 0x3f2bd01060000000>, <4 x float> %".53")
  %".55" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> <float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000>, <4 x float> %".54", <4 x float> <float 0x3f56e879c0000000, float 0x3f56e879c0000000, float 0x3f56e879c0000000, float 0x3f56e879c0000000>)
  %".56" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".55", <4 x float> %".54", <4 x float> <float 0x3f81112100000000, float 0x3f81112100000000, float 0x3f81112100000000, float 0x3f81112100000000>)
  %".57" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".56", <4 x float> %".54", <4 x float> <float 0x3fa5553820000000, float 0x3fa5553820000000, float 0x3fa5553820000000, float 0x3fa5553820000000>)
  %".58" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".57", <4 x float> %".54", <4 x float> <float 0x3fc5555540000000, float 0x3fc5555540000000, float 0x3fc5555540000000, float 0x3fc5555540000000>)
  %".59" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".58", <4 x float> %".54", <4 x float> <float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000>)
  %".60" = fmul <4 x float> %".54", %".54"
  %".61" = fadd <4 x float> %".54", <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>
  %".62" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".59", <4 x float> %".60", <4 x float> %".61")
  %".63" = fptosi <4 x float> %".52" to <4 x i32>
  %".64" = add <4 x i32> %".63", <i32 127, i32 127, i32 127, i32 127>
  %".65" = shl <4 x i32> %".64", <i32 23, i32 23, i32 23, i32 23>
  %".66" = bitcast <4 x i32> %".65" to <4 x float>
  %".67" = fmul <4 x float> %".62", %".66"
  %".68" = fadd <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".67"
  %".69" = fdiv <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".68"
  store <4 x float> %".69", ptr %".46", align 4
  %".71" = load <4 x float>, ptr %".7"
  %".72" = fsub <4 x float> <float              0x0, float              0x0, float              0x0, float              0x0>, %".71"
  %".73" = call <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".72", <4 x float> <float 0xc055d33340000000, float 0xc055d33340000000, float 0xc055d33340000000, float 0xc055d33340000000>)
  %".74" = call <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".73", <4 x float> <float 0x4056133340000000, float 0x4056133340000000, float 0x4056133340000000, float 0x4056133340000000>)
  %".75" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".74", <4 x float> <float 0x3ff7154760000000, float 0x3ff7154760000000, float 0x3ff7154760000000, float 0x3ff7154760000000>, <4 x float> <float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000>)
  %".76" = call <4 x float> @"llvm.floor.v4f32"(<4 x float> %".75")
  %".77" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".76", <4 x float> <float 0xbfe6300000000000, float 0xbfe6300000000000, float 0xbfe6300000000000, float 0xbfe6300000000000>, <4 x float> %".74")
  %".78" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".76", <4 x float> <float 0x3f2bd01060000000, float 0x3f2bd01060000000, float 0x3f2bd01060000000, float 0x3f2bd01060000000>, <4 x float> %".77")
  %".79" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> <float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000, float 0x3f2a0d2ce0000000>, <4 x float> %".78", <4 x float> <float 0x3f56e879c0000000, float 0x3f56e879c0000000, float 0x3f56e879c0000000, float 0x3f56e879c0000000>)
  %".80" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".79", <4 x float> %".78", <4 x float> <float 0x3f81112100000000, float 0x3f81112100000000, float 0x3f81112100000000, float 0x3f81112100000000>)
  %".81" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".80", <4 x float> %".78", <4 x float> <float 0x3fa5553820000000, float 0x3fa5553820000000, float 0x3fa5553820000000, float 0x3fa5553820000000>)
  %".82" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".81", <4 x float> %".78", <4 x float> <float 0x3fc5555540000000, float 0x3fc5555540000000, float 0x3fc5555540000000, float 0x3fc5555540000000>)
  %".83" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".82", <4 x float> %".78", <4 x float> <float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000, float 0x3fe0000000000000>)
  %".84" = fmul <4 x float> %".78", %".78"
  %".85" = fadd <4 x float> %".78", <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>
  %".86" = call <4 x float> @"llvm.fma.v4f32"(<4 x float> %".83", <4 x float> %".84", <4 x float> %".85")
  %".87" = fptosi <4 x float> %".76" to <4 x i32>
  %".88" = add <4 x i32> %".87", <i32 127, i32 127, i32 127, i32 127>
  %".89" = shl <4 x i32> %".88", <i32 23, i32 23, i32 23, i32 23>
  %".90" = bitcast <4 x i32> %".89" to <4 x float>
  %".91" = fmul <4 x float> %".86", %".90"
  %".92" = fadd <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".91"
  %".93" = fdiv <4 x float> <float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000, float 0x3ff0000000000000>, %".92"
  %".94" = getelementptr inbounds float, ptr %".46", i64 4
  store <4 x float> %".93", ptr %".94", align 4
  %".96" = add nsw nuw i64 %"i", 1
  %".97" = icmp slt i64 %".96", 3
  br i1 %".97", label %"i.body", label %"i.done"
i.done:
  ret void
}

declare <4 x float> @"llvm.fma.v4f32"(<4 x float> %".1", <4 x float> %".2", <4 x float> %".3")

declare <4 x float> @"llvm.maxnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.minnum.v4f32"(<4 x float> %".1", <4 x float> %".2")

declare <4 x float> @"llvm.floor.v4f32"(<4 x float> %".1")
